"""Budgets, children and adoption in the Session planner: what the operator derives itself.

A child's depth, turns and budget come from the parent chain the operator reads, never from
the child's own spec, labels or annotations; a Session's budget may only lower its Agent's;
an object in the sandbox's way is never adopted.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from corral_api.kinds import Budget, Usage
from corral_operator.budgets import lowest, remainder
from corral_operator.planning.lineage import (
    Lineage,
    LineageRefusal,
    budget_above_agent,
    derive_lineage,
)
from corral_operator.planning.session import ownership, plan_session
from corral_operator.settings import OperatorSettings
from tests._objects import SESSION_UID, agent, agent_body, session_body

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
SETTINGS = OperatorSettings()


def _cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


ORCHESTRATOR: dict[str, Any] = {"orchestrator": True}


def _parent(
    name: str = "boss",
    uid: str = "boss-uid",
    agent_ref: str = "lead",
    turns: int = 0,
    usage: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running", "turns": turns}
    if usage:
        status["usage"] = usage
    return session_body(name, uid, status, agent_ref=agent_ref, **spec)


# ------------------------------------------------------------------------------- budgets


def test_lowest_and_remainder() -> None:
    got = lowest(Budget(tokens=100), None, Budget(tokens=50, costUSD=2.0), Budget(costUSD=3.0))
    assert (got.tokens, got.cost_usd) == (50, 2.0)
    assert (lowest().tokens, lowest().cost_usd) == (None, None)
    left = remainder(
        Budget(tokens=100, costUSD=1.0),
        Usage(input_tokens=30, output_tokens=20, cache_read_tokens=1000, cache_write_tokens=5),
    )
    assert left.tokens == 45  # cache reads are not counted in tokens
    assert left.cost_usd == 1.0
    spent = remainder(Budget(tokens=10, costUSD=0.5), Usage(input_tokens=99, cost=0.75))
    assert (spent.tokens, spent.cost_usd) == (0, 0.0)


@pytest.mark.parametrize(
    ("session_budget", "agent_budget", "field"),
    [
        ({"tokens": 1001}, {"tokens": 1000}, "spec.budget.tokens"),
        ({"costUSD": 5.0}, {"costUSD": 4.99}, "spec.budget.costUSD"),
        ({"tokens": 10, "costUSD": 9.0}, {"tokens": 10, "costUSD": 1.0}, "spec.budget.costUSD"),
    ],
)
def test_a_budget_above_the_agents_is_invalid_naming_the_field(
    session_budget: dict[str, Any], agent_budget: dict[str, Any], field: str
) -> None:
    assert field in (
        budget_above_agent(
            Budget.model_validate(session_budget), Budget.model_validate(agent_budget)
        )
        or ""
    )
    body = session_body(budget=session_budget)
    plan = plan_session(body, agent_body(limits={"budget": agent_budget}), None, SETTINGS, NOW)
    assert plan.status["phase"] == "Failed"
    assert field in plan.status["message"]
    assert _cond(plan.status, "Failed")["reason"] == "InvalidSpec"
    assert not plan.create_sandbox


@pytest.mark.parametrize(
    ("session_budget", "agent_budget"),
    [
        ({"tokens": 1000}, {"tokens": 1000}),  # equal is allowed
        ({"tokens": 10}, None),  # an Agent without a budget caps nothing
        (None, {"costUSD": 1.0}),
        ({"costUSD": 0.5}, {"tokens": 5}),  # different axes do not compare
    ],
)
def test_a_budget_at_or_below_the_agents_creates_the_sandbox(
    session_budget: dict[str, Any] | None, agent_budget: dict[str, Any] | None
) -> None:
    spec: dict[str, Any] = {"budget": session_budget} if session_budget else {}
    limits: dict[str, Any] = {"limits": {"budget": agent_budget}} if agent_budget else {}
    plan = plan_session(session_body(**spec), agent_body(**limits), None, SETTINGS, NOW)
    assert plan.create_sandbox, plan.status
    assert plan.lineage is not None


def test_the_effective_budget_reaches_the_plan() -> None:
    body = session_body(budget={"tokens": 500})
    plan = plan_session(body, agent_body(limits={"budget": {"costUSD": 1.5}}), None, SETTINGS, NOW)
    assert plan.lineage is not None
    assert (plan.lineage.budget.tokens, plan.lineage.budget.cost_usd) == (500, 1.5)


# ------------------------------------------------------------------------------- children


def _child(**kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"parentRef": {"name": "boss", "uid": "boss-uid"}}
    spec.update(kw.pop("spec", {}))
    return session_body("boss-child-1", "child-uid", kw.pop("status", None), **spec, **kw)


def _plan_child(
    child: dict[str, Any],
    parents: list[dict[str, Any]],
    agents: dict[str, dict[str, Any] | None],
    own_agent: dict[str, Any] | None = None,
) -> Any:
    return plan_session(
        child,
        own_agent or agent_body(),
        None,
        SETTINGS,
        NOW,
        parents=parents,
        ancestor_agents=agents,
    )


LEAD = agent_body("lead", orchestrator=True, limits={"maxTurns": 10})


def test_a_child_under_its_parents_agent_runs() -> None:
    child = _child(spec={"agentRef": "lead"})
    plan = _plan_child(child, [_parent()], {"lead": LEAD}, own_agent=LEAD)
    assert plan.create_sandbox, plan.status
    assert plan.lineage == Lineage(depth=1, max_turns=10, budget=lowest(), root="boss")


def test_a_child_under_another_agent_is_refused_naming_agent_ref() -> None:
    plan = _plan_child(_child(), [_parent()], {"lead": LEAD})
    assert plan.status["phase"] == "Failed"
    assert "spec.agentRef" in plan.status["message"]
    assert "'coder'" in plan.status["message"]
    assert _cond(plan.status, "Failed")["reason"] == "InvalidSpec"
    assert not plan.create_sandbox


def test_a_child_under_an_agent_its_parents_agent_lists_runs() -> None:
    lead = agent_body("lead", orchestrator=True, children={"agents": ["coder"]})
    plan = _plan_child(_child(), [_parent()], {"lead": lead})
    assert plan.create_sandbox, plan.status


def test_a_parent_that_is_no_orchestrator_has_no_children() -> None:
    plain = agent_body("lead", children={"agents": ["coder"]})
    plan = _plan_child(_child(), [_parent()], {"lead": plain})
    assert plan.status["phase"] == "Failed"
    assert "not an orchestrator" in plan.status["message"]


def test_a_parent_ref_with_another_uid_is_refused() -> None:
    child = _child(spec={"agentRef": "lead", "parentRef": {"name": "boss", "uid": "old-uid"}})
    plan = _plan_child(child, [_parent()], {"lead": LEAD}, own_agent=LEAD)
    assert plan.status["phase"] == "Failed"
    assert "spec.parentRef.uid" in plan.status["message"]


def test_a_parent_that_is_not_there_is_refused() -> None:
    plan = _plan_child(_child(spec={"agentRef": "lead"}), [], {}, own_agent=LEAD)
    assert plan.status["phase"] == "Failed"
    assert "spec.parentRef" in plan.status["message"]
    assert "not found" in plan.status["message"]


def test_a_missing_ancestor_agent_holds_the_child() -> None:
    plan = _plan_child(_child(spec={"agentRef": "lead"}), [_parent()], {"lead": None}, LEAD)
    assert plan.status["phase"] == "Pending"
    assert _cond(plan.status, "Progressing")["reason"] == "AgentNotFound"
    assert plan.requeue_after is not None and not plan.create_sandbox


def _chain(depth: int, max_depth: int = 3) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`depth` ancestors, nearest first, all under one orchestrator Agent."""
    lead = agent_body("lead", orchestrator=True, limits={"maxDepth": max_depth})
    parents = []
    for level in range(depth, 0, -1):
        ref = {"parentRef": {"name": f"s{level - 1}", "uid": f"u{level - 1}"}} if level > 1 else {}
        parents.append(_parent(f"s{level}", f"u{level}", **ref))
    # parents[0] is s{depth}, its parent s{depth-1}, ..., the root s1 has no parentRef.
    return parents, lead


@pytest.mark.parametrize(("depth", "max_depth", "ok"), [(1, 1, True), (2, 1, False), (3, 3, True)])
def test_depth_is_derived_from_the_chain_against_the_root_agents_max_depth(
    depth: int, max_depth: int, ok: bool
) -> None:
    parents, lead = _chain(depth, max_depth)
    child = session_body(
        "leaf",
        "leaf-uid",
        agent_ref="lead",
        parentRef={"name": f"s{depth}", "uid": f"u{depth}"},
    )
    # Whatever the child claims about itself is not read.
    child["metadata"]["labels"] = {"corral.dev/depth": "0"}
    plan = _plan_child(child, parents, {"lead": lead}, own_agent=lead)
    if ok:
        assert plan.create_sandbox, plan.status
        assert plan.lineage is not None and plan.lineage.depth == depth
    else:
        assert plan.status["phase"] == "Failed"
        assert "depth" in plan.status["message"] and "maxDepth" in plan.status["message"]
        assert _cond(plan.status, "Failed")["reason"] == "InvalidSpec"


def test_a_chain_deeper_than_the_hard_cap_is_refused() -> None:
    parents, lead = _chain(4)
    child = session_body(
        "leaf", "leaf-uid", agent_ref="lead", parentRef={"name": "s4", "uid": "u4"}
    )
    outcome = derive_lineage(child, agent("lead", orchestrator=True).spec, parents, {"lead": lead})
    assert isinstance(outcome, LineageRefusal) and "deeper than 3" in outcome.message


def test_a_looping_chain_is_refused() -> None:
    a = _parent("a", "ua", parentRef={"name": "b", "uid": "ub"})
    b = _parent("b", "ub", parentRef={"name": "a", "uid": "ua"})
    child = session_body("c", "uc", agent_ref="lead", parentRef={"name": "a", "uid": "ua"})
    outcome = derive_lineage(child, agent("lead").spec, [a, b, a], {"lead": LEAD})
    assert isinstance(outcome, LineageRefusal) and "loops" in outcome.message


def test_turns_are_capped_by_what_the_parent_has_left_whatever_the_child_says() -> None:
    parent = _parent(turns=7)  # lead allows 10: 3 left, counting the turn in flight
    child = _child(spec={"agentRef": "lead"}, annotations={"corral.dev/max-turns": "999"})
    plan = _plan_child(child, [parent], {"lead": LEAD}, own_agent=LEAD)
    assert plan.lineage is not None and plan.lineage.max_turns == 3


def test_the_max_turns_annotation_can_only_lower_the_cap() -> None:
    child = _child(spec={"agentRef": "lead"}, annotations={"corral.dev/max-turns": "2"})
    plan = _plan_child(child, [_parent()], {"lead": LEAD}, own_agent=LEAD)
    assert plan.lineage is not None and plan.lineage.max_turns == 2


def test_turns_left_are_carried_down_the_whole_chain() -> None:
    root = _parent("s1", "u1", turns=8)  # 10 - 8 = 2 left
    middle = _parent("s2", "u2", turns=0, parentRef={"name": "s1", "uid": "u1"})
    child = session_body(
        "leaf", "leaf-uid", agent_ref="lead", parentRef={"name": "s2", "uid": "u2"}
    )
    outcome = derive_lineage(child, agent("lead").spec, [middle, root], {"lead": LEAD})
    assert isinstance(outcome, Lineage) and outcome.max_turns == 2


def test_a_child_whose_parent_has_no_turns_left_fails() -> None:
    parent = _parent(turns=10)
    plan = _plan_child(_child(spec={"agentRef": "lead"}), [parent], {"lead": LEAD}, LEAD)
    assert plan.status["phase"] == "Failed"
    assert _cond(plan.status, "Failed")["reason"] == "TurnLimitReached"
    assert not plan.create_sandbox


def test_a_session_at_its_turn_cap_is_not_driven_again() -> None:
    status = {"phase": "WaitingForChildren", "podName": "corral-fix-bug", "turns": 10}
    body = session_body(status=status, agent_ref="lead")
    plan = plan_session(body, LEAD, _ready_pod(), SETTINGS, NOW, [])
    assert not plan.drive
    assert plan.status["phase"] == "Failed"
    assert _cond(plan.status, "Failed")["reason"] == "TurnLimitReached"


def test_a_childs_budget_is_its_parents_remainder_at_most() -> None:
    lead = agent_body("lead", orchestrator=True, limits={"budget": {"tokens": 1000}})
    used = {"inputTokens": 600, "outputTokens": 100, "cost": 0.2}
    parent = _parent(usage=used, budget={"costUSD": 1.0})
    child = _child(spec={"agentRef": "lead", "budget": {"tokens": 900}})
    plan = _plan_child(child, [parent], {"lead": lead}, own_agent=lead)
    assert plan.lineage is not None
    assert plan.lineage.budget.tokens == 300  # 1000 - 700 used by the parent
    assert plan.lineage.budget.cost_usd == pytest.approx(0.8)


def test_a_child_of_a_parent_with_a_spent_budget_fails_budget_exceeded() -> None:
    lead = agent_body("lead", orchestrator=True, limits={"budget": {"tokens": 100}})
    parent = _parent(usage={"inputTokens": 100})
    plan = _plan_child(_child(spec={"agentRef": "lead"}), [parent], {"lead": lead}, lead)
    assert plan.status["phase"] == "Failed"
    assert _cond(plan.status, "Failed")["reason"] == "BudgetExceeded"
    assert not plan.create_sandbox


# ------------------------------------------------------------------------------- adoption


def _ready_pod(owner: str = SESSION_UID, **ref: Any) -> dict[str, Any]:
    reference = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "name": "fix-bug",
        "uid": owner,
        "controller": True,
    }
    reference.update(ref)
    return {
        "metadata": {"name": "corral-fix-bug", "uid": "pod-uid", "ownerReferences": [reference]},
        "status": {"podIP": "127.0.3.4", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _object(kind: str, name: str, refs: list[dict[str, Any]] | None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name}
    if refs is not None:
        md["ownerReferences"] = refs
    return {"kind": kind, "metadata": md}


OURS = [
    {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "name": "fix-bug",
        "uid": SESSION_UID,
        "controller": True,
    }
]


@pytest.mark.parametrize(
    ("refs", "verdict"),
    [
        (OURS, "ours"),
        ([{**OURS[0], "controller": False}], "foreign"),  # named, but not its controller
        ([{**OURS[0], "uid": "earlier-uid"}], "earlier"),
        ([{**OURS[0], "uid": "earlier-uid", "name": "other"}], "foreign"),
        ([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "x", "uid": "d"}], "foreign"),
        (None, "foreign"),
    ],
)
def test_ownership(refs: list[dict[str, Any]] | None, verdict: str) -> None:
    assert (
        ownership(_object("Secret", "corral-fix-bug-wire", refs), "fix-bug", SESSION_UID) == verdict
    )


@pytest.mark.parametrize(
    ("kind", "name"),
    [("Secret", "corral-fix-bug-wire"), ("NetworkPolicy", "corral-fix-bug")],
)
def test_a_foreign_object_in_the_way_fails_the_session_naming_it(kind: str, name: str) -> None:
    existing = {kind: _object(kind, name, None)}
    plan = plan_session(session_body(), agent_body(), None, SETTINGS, NOW, existing=existing)
    assert plan.status["phase"] == "Failed"
    assert f"{kind} {name}" in plan.status["message"]
    assert "not owned by this Session" in plan.status["message"]
    assert _cond(plan.status, "Failed")["reason"] == "ObjectInTheWay"
    assert not plan.create_sandbox and not plan.delete_pod


def test_a_foreign_pod_is_neither_used_nor_deleted() -> None:
    stranger = _ready_pod(owner="someone", name="someone", kind="ReplicaSet", apiVersion="apps/v1")
    plan = plan_session(session_body(), agent_body(), stranger, SETTINGS, NOW)
    assert plan.status["phase"] == "Failed"
    assert "Pod corral-fix-bug" in plan.status["message"]
    assert not plan.drive and not plan.delete_pod
    # Once failed, the next pass leaves the stranger's pod alone.
    again = plan_session(session_body(status=plan.status), agent_body(), stranger, SETTINGS, NOW)
    assert not again.delete_pod


def test_objects_of_an_earlier_session_with_the_name_are_waited_out() -> None:
    earlier = [{**OURS[0], "uid": "earlier-uid"}]
    existing = {"Secret": _object("Secret", "corral-fix-bug-wire", earlier)}
    plan = plan_session(session_body(), agent_body(), None, SETTINGS, NOW, existing=existing)
    assert plan.status["phase"] == "Pending"
    assert _cond(plan.status, "Progressing")["reason"] == "SandboxConflict"
    assert plan.requeue_after == 1.0 and not plan.create_sandbox


def test_our_own_objects_are_used() -> None:
    existing = {
        "Secret": _object("Secret", "corral-fix-bug-wire", OURS),
        "NetworkPolicy": _object("NetworkPolicy", "corral-fix-bug", OURS),
    }
    plan = plan_session(session_body(), agent_body(), None, SETTINGS, NOW, existing=existing)
    assert plan.create_sandbox
    plan = plan_session(session_body(), agent_body(), _ready_pod(), SETTINGS, NOW)
    assert plan.drive and plan.pod_ip == "127.0.3.4"


# ------------------------------------------------------------------------ final reasons


def test_a_turn_failed_for_the_budget_ends_budget_exceeded_and_the_reason_stays() -> None:
    status = {
        "phase": "Failed",
        "podName": "corral-fix-bug",
        "turns": 1,
        "finishedAt": "2026-11-29T11:59:00Z",
        "lastSettlement": {
            "submissionId": "s",
            "status": "failed",
            "turn": 1,
            "error": "budget_exceeded_error: the session's token budget is spent",
        },
    }
    plan = plan_session(session_body(status=status), agent_body(), None, SETTINGS, NOW)
    assert _cond(plan.status, "Failed")["reason"] == "BudgetExceeded"


def test_the_reason_a_session_ended_with_is_kept_on_later_passes() -> None:
    body = session_body(workspace={"repo": "https://x/r.git", "ref": "-evil"})
    first = plan_session(body, agent_body(), None, SETTINGS, NOW)
    assert _cond(first.status, "Failed")["reason"] == "InvalidSpec"
    body["status"] = first.status
    again = plan_session(body, agent_body(), None, SETTINGS, NOW)
    assert _cond(again.status, "Failed")["reason"] == "InvalidSpec"
    assert not again.status_changed
