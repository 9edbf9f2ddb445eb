"""The Session planner's checks, each alone, and the order of their chain: every check decides
on the input it is about (the decision and its reason) and passes (None) on one it is not."""

from __future__ import annotations

from typing import Any

import pytest

from corral_api.freeze import FrozenBy
from corral_operator.planning import _session_checks as checks
from corral_operator.planning import reasons as R
from corral_operator.planning._session_checks import (
    SESSION_CHECKS,
    SessionCheck,
    SessionDecision,
    decide_session,
)
from corral_operator.planning._session_inputs import SessionInputs
from tests._objects import SESSION_UID, agent_body, approval_decision, sandbox_pod, session_body

from .test_lineage import _child, _parent
from .test_session_planner import NOW, SETTINGS

FROZEN = FrozenBy(freeze="audit", scope="namespace team-a", reason="the quarterly audit")
LEDGER = {"streamUrl": "/u", "offset": 0, "submissionId": "sub-1", "turn": 2}
LEAD = agent_body("lead", orchestrator=True, limits={"maxTurns": 10})
WAKE = {"afterSeconds": 60, "message": "Wake up."}
_READY_AGENT = object()


def _inputs(
    status: dict[str, Any] | None = None,
    *,
    agent: Any = _READY_AGENT,
    pod: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    **kw: Any,
) -> SessionInputs:
    body = agent_body() if agent is _READY_AGENT else agent
    return SessionInputs(
        session_body(status=status, **(spec or {})), body, pod, SETTINGS, NOW, **kw
    )


def _serving(status: dict[str, Any] | None = None, **kw: Any) -> SessionInputs:
    """Inputs whose pod is ready and has an IP: the harness serves."""
    return _inputs(status, pod=sandbox_pod(True), **kw)


def _running(**status: Any) -> dict[str, Any]:
    return {"phase": "Running", "podName": "corral-fix-bug", "turns": 1, **status}


def _ended(**status: Any) -> dict[str, Any]:
    finished = {"finishedAt": "2026-11-29T11:58:00Z"}
    return {"phase": "Succeeded", "podName": "corral-fix-bug", "turns": 1, **finished, **status}


def _invalid_spec() -> SessionInputs:
    body = session_body()
    body["spec"]["task"] = ""
    return SessionInputs(body, agent_body(), None, SETTINGS, NOW)


def _owned_by(uid: str, name: str = "fix-bug") -> dict[str, Any]:
    ref: dict[str, Any] = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "name": name,
        "uid": uid,
    }
    if uid == SESSION_UID:
        ref["controller"] = True
    return {"metadata": {"name": "corral-fix-bug", "ownerReferences": [ref]}}


def _decided(check: SessionCheck, inputs: SessionInputs) -> SessionDecision:
    decision = check(inputs)
    assert decision is not None, f"{check.__name__} did not decide"
    return decision


# ---------------------------------------------------------------- the spec and the objects


def test_spec_invalid_fails_the_session_naming_the_field() -> None:
    decision = _decided(checks.spec_invalid, _invalid_spec())
    assert decision.reason == R.INVALID_SPEC and decision.sandbox == "released"
    assert (
        decision.status.phase == "Failed" and decision.status.finished_at == "2026-11-29T12:00:00Z"
    )
    assert (decision.status.message or "").startswith("invalid spec: spec.task: ")


def test_spec_invalid_leaves_an_ended_session_as_it_ended() -> None:
    inputs = _invalid_spec()
    body = {**inputs.body, "status": _ended(message="done")}
    decision = _decided(checks.spec_invalid, SessionInputs(body, None, None, SETTINGS, NOW))
    assert decision.reason is None and decision.sandbox == "released"
    assert decision.status.phase == "Succeeded" and decision.status.message == "done"
    assert not decision.delete_pod


def test_objects_not_ours_fails_naming_them() -> None:
    foreign = {"metadata": {"name": "corral-fix-bug"}}
    inputs = _inputs(existing={"Secret": foreign, "NetworkPolicy": foreign})
    decision = _decided(checks.objects_not_ours, inputs)
    assert decision.reason == R.OBJECT_IN_THE_WAY and decision.sandbox == "absent"
    assert decision.status.phase == "Failed"
    assert (decision.status.message or "").startswith(
        "NetworkPolicy corral-fix-bug and Secret corral-fix-bug already exist and are not owned"
    )


def test_objects_not_ours_counts_the_pod_too() -> None:
    pod = sandbox_pod(True, owner="replica-set-uid")
    pod["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSet"
    decision = _decided(checks.objects_not_ours, _inputs(pod=pod))
    assert "Pod corral-fix-bug already exists and is not owned" in (decision.status.message or "")


def test_earlier_sandbox_going_waits_for_garbage_collection() -> None:
    decision = _decided(checks.earlier_sandbox_going, _inputs(existing={"Secret": _owned_by("x")}))
    assert decision.reason == R.SANDBOX_CONFLICT and decision.requeue_after == 1.0
    assert decision.status.message == "waiting for an earlier sandbox to go"
    assert not decision.create_sandbox


# ---------------------------------------------------------------- the end and the TTL


def test_ttl_expired_deletes_the_session_and_releases_its_pod() -> None:
    inputs = _serving(_ended(), spec={"ttlSecondsAfterFinished": 60})
    decision = _decided(checks.ttl_expired, inputs)
    assert decision.delete_session and decision.delete_pod and decision.requeue_after is None
    assert decision.reason is None and decision.sandbox == "released"


def test_ttl_expired_at_the_second_it_runs_out() -> None:
    # Finished two minutes ago with a TTL of two minutes: nothing is left.
    inputs = _inputs(_ended(), spec={"ttlSecondsAfterFinished": 120})
    assert _decided(checks.ttl_expired, inputs).delete_session
    assert checks.ttl_expired(_inputs(_ended(), spec={"ttlSecondsAfterFinished": 121})) is None


def test_ended_releases_the_pod_and_comes_back_at_the_ttl() -> None:
    inputs = _serving(_ended(), spec={"ttlSecondsAfterFinished": 3600})
    decision = _decided(checks.ended, inputs)
    assert decision.delete_pod and not decision.delete_session
    assert decision.requeue_after == 3480.0 and decision.sandbox == "released"
    assert decision.status == inputs.old


def test_ended_keeps_the_pod_with_keep_sandbox() -> None:
    decision = _decided(checks.ended, _serving(_ended(), spec={"keepSandbox": True}))
    assert decision.sandbox == "kept" and not decision.delete_pod
    assert decision.requeue_after is None


def test_ended_never_releases_a_pod_that_is_not_ours() -> None:
    decision = _decided(checks.ended, _inputs(_ended(), pod=sandbox_pod(True, owner="someone")))
    assert not decision.delete_pod and decision.sandbox == "released"


# ---------------------------------------------------------------- the Agent and the chain


def test_agent_missing_holds_the_session_pending() -> None:
    decision = _decided(checks.agent_missing, _inputs(agent=None))
    assert decision.reason == R.AGENT_NOT_FOUND and decision.requeue_after == 5.0
    assert decision.status.phase == "Pending"
    assert decision.status.message == "Agent 'coder' not found"


def test_agent_not_ready_holds_the_session_saying_why() -> None:
    decision = _decided(checks.agent_not_ready, _inputs(agent=agent_body(ready=False)))
    assert decision.reason == R.AGENT_NOT_READY and decision.requeue_after == 5.0
    assert decision.status.message == "Agent 'coder' is not ready: tools.deny has '*'"


def test_agent_invalid_fails_when_the_agent_does_not_validate() -> None:
    agent = agent_body()
    agent["spec"] = {**agent["spec"], "nonsense": True}
    decision = _decided(checks.agent_invalid, _inputs(agent=agent))
    assert decision.reason == R.INVALID_SPEC and decision.status.phase == "Failed"
    assert "nonsense" in (decision.status.message or "")


def test_agent_invalid_fails_when_no_sandbox_pod_can_be_built() -> None:
    inputs = _inputs(spec={"workspace": {"repo": "https://x/r.git", "ref": "-evil"}})
    decision = _decided(checks.agent_invalid, inputs)
    assert decision.reason == R.INVALID_SPEC and decision.sandbox == "released"
    assert "must not start with '-'" in (decision.status.message or "")


def test_budget_above_agent_fails() -> None:
    inputs = _inputs(
        agent=agent_body(limits={"budget": {"tokens": 100}}), spec={"budget": {"tokens": 500}}
    )
    decision = _decided(checks.budget_above_agent, inputs)
    assert decision.reason == R.INVALID_SPEC
    assert (decision.status.message or "").startswith("invalid spec: spec.budget.tokens 500")


def test_branch_refused_fails_naming_the_branch() -> None:
    workspace = {"repo": "https://git.example/repo.git", "ref": "main", "branch": "main"}
    decision = _decided(checks.branch_refused, _inputs(spec={"workspace": workspace}))
    assert decision.reason == R.INVALID_SPEC
    assert "spec.workspace.branch 'main'" in (decision.status.message or "")


def _child_inputs(
    parents: list[dict[str, Any]], agents: dict[str, dict[str, Any] | None], **kw: Any
) -> SessionInputs:
    child = _child(spec={"agentRef": "lead"}, **kw)
    return SessionInputs(child, LEAD, None, SETTINGS, NOW, parents=parents, ancestor_agents=agents)


def test_lineage_refused_fails_a_child_whose_parent_is_not_there() -> None:
    decision = _decided(checks.lineage_refused, _child_inputs([], {}))
    assert decision.reason == R.INVALID_SPEC and decision.sandbox == "released"
    assert "spec.parentRef" in (decision.status.message or "")
    assert decision.status.phase == "Failed"


def test_lineage_refused_holds_a_child_whose_ancestor_agent_is_missing() -> None:
    decision = _decided(checks.lineage_refused, _child_inputs([_parent()], {"lead": None}))
    assert decision.reason == R.AGENT_NOT_FOUND and decision.requeue_after == 5.0
    assert decision.status.phase == "Pending" and decision.sandbox == "absent"


# ---------------------------------------------------------------- no living pod


def test_pod_lost_fails_a_session_that_had_one() -> None:
    decision = _decided(checks.pod_lost, _inputs(_running()))
    assert decision.reason == R.SANDBOX_LOST and decision.status.phase == "Failed"
    assert decision.status.message == "the sandbox pod corral-fix-bug was lost"


def test_pod_terminating_waits_for_it_to_go() -> None:
    decision = _decided(checks.pod_terminating, _inputs(pod=sandbox_pod(True, deleting=True)))
    assert decision.reason is None and decision.requeue_after == 1.0
    assert decision.sandbox == "absent" and not decision.create_sandbox


def test_no_turn_to_start_fails_before_the_sandbox() -> None:
    inputs = _inputs({"phase": "Pending", "turns": 1}, agent=agent_body(limits={"maxTurns": 1}))
    decision = _decided(checks.no_turn_to_start, inputs)
    assert decision.reason == R.TURN_LIMIT_REACHED and decision.sandbox == "released"
    assert decision.status.message == "no turn left: 1 of 1 used"


def test_frozen_before_start_creates_nothing() -> None:
    decision = _decided(checks.frozen_before_start, _inputs(frozen_by=FROZEN))
    assert decision.reason == R.FROZEN and decision.requeue_after == checks.FROZEN_RECHECK
    assert decision.status.message == FROZEN.describe() and not decision.create_sandbox


def test_budget_spent_before_start_fails_a_child_of_a_spent_parent() -> None:
    lead = agent_body("lead", orchestrator=True, limits={"budget": {"tokens": 100}})
    parent = _parent(usage={"inputTokens": 100})
    inputs = SessionInputs(
        _child(spec={"agentRef": "lead"}), lead, None, SETTINGS, NOW,
        parents=[parent], ancestor_agents={"lead": lead},
    )  # fmt: skip
    decision = _decided(checks.budget_spent_before_start, inputs)
    assert decision.reason == R.BUDGET_EXCEEDED and decision.status.phase == "Failed"
    assert decision.status.message == (
        "the budget is spent before the session starts: nothing left in tokens"
        " (the parent session's remainder)"
    )


def test_create_sandbox_creates_the_pod_and_says_so() -> None:
    decision = _decided(checks.create_sandbox, _inputs())
    assert decision.create_sandbox and decision.reason == R.CREATING_SANDBOX
    assert decision.sandbox == "starting" and decision.lineage is not None
    assert decision.status.pod_name == "corral-fix-bug"
    assert decision.status.message == checks.STARTING_MESSAGE
    assert decision.events == (
        checks.PlannedEvent("Normal", "SandboxCreating", "creating pod corral-fix-bug"),
    )


# ---------------------------------------------------------------- the pod lives


def test_sandbox_starting_waits_for_the_harness() -> None:
    decision = _decided(checks.sandbox_starting, _inputs(pod=sandbox_pod(False)))
    assert decision.reason == R.CREATING_SANDBOX and decision.sandbox == "starting"
    assert decision.requeue_after == checks.STARTING_RECHECK
    assert decision.harness_url is None


def test_sandbox_starting_after_the_first_turn_gives_no_reason_of_its_own() -> None:
    decision = _decided(checks.sandbox_starting, _inputs(_running(), pod=sandbox_pod(False)))
    assert decision.reason is None and decision.status.phase == "Running"


def test_frozen_in_flight_drives_only_to_interrupt() -> None:
    inputs = _serving(_running(ledger=LEDGER), frozen_by=FROZEN)
    decision = _decided(checks.frozen_in_flight, inputs)
    assert decision.reason == R.FROZEN and decision.frozen_by == FROZEN
    assert decision.harness_url == "http://127.0.3.4:8080" and decision.pod_ip == "127.0.3.4"


def test_frozen_between_turns_admits_nothing() -> None:
    decision = _decided(checks.frozen_between_turns, _serving(frozen_by=FROZEN))
    assert decision.reason == R.FROZEN and decision.harness_url is None
    assert decision.status.message == FROZEN.describe()
    assert decision.requeue_after == checks.FROZEN_RECHECK


def _waiting_for_wake(wake_at: str) -> dict[str, Any]:
    return _running(phase="WaitingForWake", wakeAt=wake_at)


def test_wake_cancelled_ends_the_session() -> None:
    decision = _decided(checks.wake_cancelled, _serving(_waiting_for_wake("2026-11-29T13:00:00Z")))
    assert decision.reason == R.COMPLETED and decision.status.phase == "Succeeded"
    assert decision.status.finished_at == "2026-11-29T12:00:00Z"


def test_wake_not_due_comes_back_when_it_is() -> None:
    inputs = _serving(_waiting_for_wake("2026-11-29T12:00:42Z"), spec={"wake": WAKE})
    decision = _decided(checks.wake_not_due, inputs)
    assert decision.requeue_after == 42.0 and decision.harness_url is None
    assert decision.reason is None


def test_waiting_for_children_comes_back_while_one_runs() -> None:
    running = [{"metadata": {"name": "c"}, "status": {"phase": "Running"}}]
    inputs = _serving(_running(phase="WaitingForChildren"), children=running)
    decision = _decided(checks.waiting_for_children, inputs)
    assert decision.requeue_after == checks.WAIT_RECHECK and decision.harness_url is None
    assert decision.status.children is not None and decision.status.children.running == 1


def test_waiting_for_human_comes_back_while_its_approval_is_pending() -> None:
    inputs = _serving(_running(phase="WaitingForHuman"), approvals=[approval_decision(None)])
    decision = _decided(checks.waiting_for_human, inputs)
    assert decision.requeue_after == checks.WAIT_RECHECK and decision.harness_url is None


def test_waiting_for_human_comes_back_while_a_question_has_no_reply() -> None:
    status = _running(phase="WaitingForHuman", question="Which one?", repliesRead=0)
    decision = _decided(checks.waiting_for_human, _serving(status))
    assert decision.requeue_after == checks.WAIT_RECHECK


def test_turn_limit_reached_fails_instead_of_one_turn_too_many() -> None:
    inputs = _serving(_running(), agent=agent_body(limits={"maxTurns": 1}))
    decision = _decided(checks.turn_limit_reached, inputs)
    assert decision.reason == R.TURN_LIMIT_REACHED and decision.status.phase == "Failed"
    assert decision.harness_url is None


def test_the_steady_state_drives_the_session_at_its_harness() -> None:
    decision = checks.steady_state(_serving())
    assert decision.harness_url == "http://127.0.3.4:8080" and decision.pod_ip == "127.0.3.4"
    assert decision.sandbox == "ready" and decision.lineage is not None
    assert decision.status.message == "the harness is ready"


# ---------------------------------------------------------------- each check passes the rest

PASSES: list[tuple[SessionCheck, SessionInputs]] = [
    (checks.spec_invalid, _inputs()),
    (checks.objects_not_ours, _inputs(existing={"Secret": _owned_by(SESSION_UID)})),
    (checks.objects_not_ours, _inputs(_ended(), existing={"Secret": {"metadata": {"name": "s"}}})),
    (checks.earlier_sandbox_going, _inputs(existing={"Secret": _owned_by(SESSION_UID)})),
    (checks.earlier_sandbox_going, _inputs(_ended(), existing={"Secret": _owned_by("x")})),
    (checks.ttl_expired, _inputs(_ended(), spec={"ttlSecondsAfterFinished": 3600})),
    (checks.ttl_expired, _inputs(_ended())),
    (checks.ttl_expired, _inputs(_running(), spec={"ttlSecondsAfterFinished": 0})),
    (checks.ended, _inputs(_running())),
    (checks.agent_missing, _inputs()),
    (checks.agent_not_ready, _inputs()),
    (checks.agent_not_ready, _inputs(agent=None)),
    (checks.agent_invalid, _inputs()),
    (checks.budget_above_agent, _inputs(spec={"budget": {"tokens": 500}})),
    (checks.branch_refused, _inputs()),
    (checks.lineage_refused, _inputs()),
    (checks.lineage_refused, _child_inputs([_parent()], {"lead": LEAD})),
    (checks.suspending, _serving(_running(ledger=LEDGER))),
    (checks.suspending, _serving(_running(), spec={"suspend": True})),
    (checks.suspending, _inputs(_running(ledger=LEDGER), spec={"suspend": True})),
    (checks.suspended, _serving(_running())),
    (checks.unsuspended, _serving(_running(), spec={"suspend": True})),
    (checks.unsuspended, _inputs({"phase": "Suspended"}, spec={"suspend": True})),
    (checks.pod_lost, _inputs({"phase": "Pending", "podName": "corral-fix-bug"})),
    (checks.pod_lost, _inputs(_running(), pod=sandbox_pod(False))),
    (checks.pod_terminating, _inputs()),
    (checks.pod_terminating, _inputs(pod=sandbox_pod(False))),
    (checks.no_turn_to_start, _inputs({"turns": 1}, agent=agent_body(limits={"maxTurns": 2}))),
    (checks.no_turn_to_start, _serving(_running(), agent=agent_body(limits={"maxTurns": 1}))),
    (checks.frozen_before_start, _inputs()),
    (checks.frozen_before_start, _inputs(pod=sandbox_pod(False), frozen_by=FROZEN)),
    (checks.budget_spent_before_start, _inputs(spec={"budget": {"tokens": 10}})),
    (checks.create_sandbox, _inputs(pod=sandbox_pod(False))),
    (checks.sandbox_starting, _serving()),
    (checks.frozen_in_flight, _serving(_running(ledger=LEDGER))),
    (checks.frozen_in_flight, _serving(frozen_by=FROZEN)),
    (checks.frozen_between_turns, _serving()),
    (
        checks.wake_cancelled,
        _serving(_waiting_for_wake("2026-11-29T13:00:00Z"), spec={"wake": WAKE}),
    ),
    (checks.wake_cancelled, _serving(_running())),
    (checks.wake_not_due, _serving(_waiting_for_wake("2026-11-29T11:59:00Z"), spec={"wake": WAKE})),
    (checks.wake_not_due, _serving(_waiting_for_wake("2026-11-29T13:00:00Z"))),
    (checks.waiting_for_children, _serving(_running(phase="WaitingForChildren"), children=[])),
    (checks.waiting_for_children, _serving(_running())),
    (
        checks.waiting_for_human,
        _serving(_running(phase="WaitingForHuman"), approvals=[approval_decision("Approved")]),
    ),
    (
        checks.waiting_for_human,
        _serving(
            _running(phase="WaitingForHuman", question="Which?"), spec={"replies": ["this one"]}
        ),
    ),
    (checks.waiting_for_human, _serving(_running(phase="WaitingForHuman", ledger=LEDGER))),
    (checks.turn_limit_reached, _serving(_running(), agent=agent_body(limits={"maxTurns": 2}))),
    (
        checks.turn_limit_reached,
        _serving(_running(ledger=LEDGER), agent=agent_body(limits={"maxTurns": 1})),
    ),
]


@pytest.mark.parametrize(
    ("check", "inputs"), PASSES, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(PASSES)]
)
def test_a_check_passes_what_it_does_not_decide(check: SessionCheck, inputs: SessionInputs) -> None:
    assert check(inputs) is None


def test_every_check_has_a_case_it_passes() -> None:
    assert {c for c, _ in PASSES} == set(SESSION_CHECKS)


# ---------------------------------------------------------------- the order of the chain


def test_the_chain_is_in_the_documented_order() -> None:
    assert [c.__name__ for c in SESSION_CHECKS] == [
        "spec_invalid",
        "objects_not_ours",
        "earlier_sandbox_going",
        "ttl_expired",
        "ended",
        "agent_missing",
        "agent_not_ready",
        "agent_invalid",
        "budget_above_agent",
        "branch_refused",
        "lineage_refused",
        "suspending",
        "suspended",
        "unsuspended",
        "pod_lost",
        "pod_terminating",
        "no_turn_to_start",
        "frozen_before_start",
        "budget_spent_before_start",
        "create_sandbox",
        "sandbox_starting",
        "frozen_in_flight",
        "frozen_between_turns",
        "wake_cancelled",
        "wake_not_due",
        "waiting_for_children",
        "waiting_for_human",
        "turn_limit_reached",
    ]


@pytest.mark.parametrize(
    ("inputs", "first", "later"),
    [
        # A frozen Session whose Agent is missing says the Agent is missing.
        (_inputs(agent=None, frozen_by=FROZEN), R.AGENT_NOT_FOUND, checks.frozen_before_start),
        # An unreadable spec is said before an object in the way.
        (
            SessionInputs(
                _invalid_spec().body,
                agent_body(),
                None,
                SETTINGS,
                NOW,
                existing={"Secret": {"metadata": {"name": "corral-fix-bug"}}},
            ),
            R.INVALID_SPEC,
            checks.objects_not_ours,
        ),
        # An object in the way is said before a missing Agent.
        (
            _inputs(agent=None, existing={"Secret": {"metadata": {"name": "corral-fix-bug"}}}),
            R.OBJECT_IN_THE_WAY,
            checks.agent_missing,
        ),
        # A lost pod is said before the turn limit.
        (
            _inputs(_running(), agent=agent_body(limits={"maxTurns": 1})),
            R.SANDBOX_LOST,
            checks.no_turn_to_start,
        ),
        # No turn left before the sandbox is said before a freeze.
        (
            _inputs({"turns": 1}, agent=agent_body(limits={"maxTurns": 1}), frozen_by=FROZEN),
            R.TURN_LIMIT_REACHED,
            checks.frozen_before_start,
        ),
        # A freeze holds a Session that waits for its children.
        (
            _serving(
                _running(phase="WaitingForChildren"),
                frozen_by=FROZEN,
                children=[{"status": {"phase": "Running"}}],
            ),
            R.FROZEN,
            checks.waiting_for_children,
        ),
    ],
)
def test_the_first_check_that_decides_wins(
    inputs: SessionInputs, first: str, later: SessionCheck
) -> None:
    assert later(inputs) is not None  # the later check would decide too
    assert decide_session(inputs).reason == first


def test_a_session_no_check_decides_for_is_driven() -> None:
    inputs = _serving(_running())
    assert all(check(inputs) is None for check in SESSION_CHECKS)
    assert decide_session(inputs) == checks.steady_state(inputs)
    assert decide_session(inputs).harness_url == "http://127.0.3.4:8080"
