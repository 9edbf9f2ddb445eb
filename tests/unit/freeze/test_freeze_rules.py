"""The freeze, piece by piece: which Freeze holds a Session (the rule the operator and the
custodian share), what the Session planner does while one holds, how the driver interrupts and
continues a turn, the Freeze's status, and the CLI's manifests."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from corral_api.freeze import FROZEN_ERROR, FrozenBy, covering_freeze, needs_ancestors
from corral_api.kinds import Freeze
from corral_api.wire import SettledEvent, WireError
from corral_cli.freeze_cmd import freeze_manifest, freeze_name
from corral_operator.driver import DriverState, SessionDriver
from corral_operator.driver._decide import freeze_interrupted
from corral_operator.planning.freeze import plan_freeze
from corral_operator.planning.session import plan_session
from corral_operator.settings import OperatorSettings
from tests._objects import agent_body, sandbox_pod, session_body

from ..driver.test_session_driver import AGENT, MemoryStore, StandInHarness, session
from ..operator.test_session_planner import _cond

pytestmark = pytest.mark.timeout(10)
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def sess(name: str, agent: str = "coder", ns: str = "team") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"agentRef": agent}}


def freeze(name: str, scope: dict[str, Any], ns: str = "team", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"scope": scope, **spec}}


# ------------------------------------------------------------------------------------ the rule


def test_each_scope_holds_what_it_names_and_nothing_else() -> None:
    a, b = sess("a", "coder"), sess("b", "reviewer")
    by_agent = [freeze("agent-coder", {"agent": "coder"})]
    assert covering_freeze([a], by_agent) == FrozenBy("agent-coder", "agent coder", "")
    assert covering_freeze([b], by_agent) is None
    by_session = [freeze("session-b", {"session": "b"}, reason="look")]
    assert covering_freeze([a], by_session) is None
    held = covering_freeze([b], by_session)
    assert held is not None and held.describe() == "frozen by Freeze session-b (session b): look"
    everything = [freeze("namespace", {"namespace": True})]
    assert covering_freeze([a], everything) is not None
    assert covering_freeze([b], everything) is not None


def test_a_freeze_flows_down_the_tree_and_names_the_ancestor() -> None:
    child, parent, root = sess("c", "leaf"), sess("p", "lead"), sess("r", "lead")
    held = covering_freeze([child, parent, root], [freeze("session-r", {"session": "r"})])
    assert held is not None and held.via == "r"
    assert "through its ancestor session r" in held.describe()
    held = covering_freeze([child, parent], [freeze("agent-lead", {"agent": "lead"})])
    assert held is not None and held.via == "p"
    assert needs_ancestors([freeze("x", {"agent": "lead"})], "team")
    assert not needs_ancestors([freeze("x", {"namespace": True})], "team")


def test_lifted_deleting_and_foreign_freezes_hold_nothing() -> None:
    a = sess("a")
    lifted = freeze("n", {"namespace": True}, frozen=False)
    deleting = freeze("m", {"namespace": True})
    deleting["metadata"]["deletionTimestamp"] = "2026-11-29T11:00:00Z"
    elsewhere = freeze("o", {"namespace": True}, ns="other")
    assert covering_freeze([a], [lifted, deleting, elsewhere]) is None


def test_the_first_freeze_by_name_wins_whatever_the_listing_order() -> None:
    a = sess("a")
    both = [freeze("zz", {"namespace": True}), freeze("aa", {"agent": "coder"})]
    for order in (both, both[::-1]):
        found = covering_freeze([a], order)
        assert found is not None and found.freeze == "aa"


def test_the_kind_refuses_a_scope_it_cannot_hold() -> None:
    ok = Freeze.model_validate({"metadata": {}, "spec": {"scope": {"session": "a.b"}}})
    assert ok.spec.frozen is True
    with pytest.raises(ValueError):
        Freeze.model_validate({"metadata": {}, "spec": {"scope": {"agent": "Bad_Name"}}})


# ----------------------------------------------------------------------------- the planner

HELD = FrozenBy("namespace", "namespace team", "incident")


def test_a_held_session_gets_no_sandbox_and_says_why() -> None:
    plan = plan_session(session_body(), agent_body(), None, OperatorSettings(), NOW, frozen_by=HELD)
    assert not plan.create_sandbox and not plan.drive
    assert plan.status["phase"] == "Pending"
    assert _cond(plan.status, "Frozen")["status"] == "True"
    assert _cond(plan.status, "Frozen")["reason"] == "Frozen"
    assert _cond(plan.status, "Progressing")["reason"] == "Frozen"
    assert "incident" in plan.status["message"]


def test_a_held_session_in_flight_is_driven_only_to_be_interrupted() -> None:
    ledger = {"streamUrl": "/u", "offset": 0, "submissionId": "s1", "turn": 1}
    status = {"phase": "Running", "podName": "corral-fix-bug", "ledger": ledger}
    plan = plan_session(
        session_body(status=status),
        agent_body(),
        sandbox_pod(True),
        OperatorSettings(),
        NOW,
        frozen_by=HELD,
    )
    assert plan.drive and plan.frozen_by == HELD
    idle = {"phase": "Running", "podName": "corral-fix-bug", "turns": 0}
    plan = plan_session(
        session_body(status=idle),
        agent_body(),
        sandbox_pod(True),
        OperatorSettings(),
        NOW,
        frozen_by=HELD,
    )
    assert not plan.drive and plan.requeue_after is not None


def test_lifting_the_freeze_thaws_the_condition_and_lets_the_driver_run() -> None:
    held = plan_session(
        session_body(status={"phase": "Running", "podName": "corral-fix-bug"}),
        agent_body(), sandbox_pod(True), OperatorSettings(), NOW, frozen_by=HELD,
    )  # fmt: skip
    plan = plan_session(
        session_body(status=held.status), agent_body(), sandbox_pod(True), OperatorSettings(), NOW
    )
    assert plan.drive and plan.frozen_by is None
    assert _cond(plan.status, "Frozen")["status"] == "False"
    assert _cond(plan.status, "Frozen")["reason"] == "Thawed"


def test_the_freeze_status_says_whether_it_is_in_force() -> None:
    body = freeze("namespace", {"namespace": True})
    body["metadata"]["generation"] = 2
    plan = plan_freeze(body, "2026-11-29T12:00:00Z")
    active = plan.status["conditions"][0]
    assert plan.changed and active["status"] == "True" and active["reason"] == "Frozen"
    assert plan.status["observedGeneration"] == 2
    body["status"] = plan.status
    assert not plan_freeze(body, "2026-11-29T12:00:01Z").changed
    body["spec"]["frozen"] = False
    assert plan_freeze(body, "2026-11-29T12:00:02Z").status["conditions"][0]["reason"] == "Thawed"


# ------------------------------------------------------------------------------ the driver


def test_a_frozen_refusal_from_the_custodian_is_an_interruption_too() -> None:
    refused = SettledEvent(
        offset=3, submissionId="s1", status="failed",
        error=WireError(type=FROZEN_ERROR, message="held"),
    )  # fmt: skip
    failed = refused.model_copy(update={"error": WireError(type="api_error")})
    aborted = refused.model_copy(update={"status": "aborted", "error": None})
    assert freeze_interrupted(refused, interrupt_requested=False)
    assert not freeze_interrupted(failed, interrupt_requested=True)
    assert freeze_interrupted(aborted, interrupt_requested=True)
    assert not freeze_interrupted(aborted, interrupt_requested=False)


async def test_an_interrupted_turn_is_not_counted_and_continues_under_its_number() -> None:
    wire = StandInHarness(
        turns=[[{"type": "tool_start", "toolUseId": "t", "name": "bash", "input": {}}], []],
        settle=["on_abort", "completed"],
        texts=["", "ALL GREEN"],
    )
    store = MemoryStore()
    agent = AGENT.model_copy(update={"limits": AGENT.limits.model_copy(update={"max_turns": 1})})
    spec = session(evaluation={"criteria": {"substring": "ALL GREEN"}, "turnBudget": 1})
    async with wire.client() as client:
        driver = SessionDriver(client, store, agent, spec, "c1")
        running = asyncio.create_task(driver.run())
        while not wire.admissions:
            await asyncio.sleep(0.005)
        await driver.interrupt("freeze")
        held = await asyncio.wait_for(running, 5)
        assert wire.aborts == [{"cause": "freeze", "submissionId": "s1"}]
        assert held.phase == "Running"
        state: DriverState = store.saved[-1]
        assert state.turns == 0 and state.freeze_interruptions == 1
        assert state.evaluation_turns == 0 and state.ledger is None
        assert state.last_settlement is not None and state.last_settlement.turn == 1

        outcome = await SessionDriver(client, store, agent, spec, "c1").run()
    assert outcome.phase == "Succeeded" and outcome.turns == 1
    assert store.saved[-1].evaluation_turns == 1
    again = wire.admissions[1]
    assert again["turn"] == 1 and again["idempotencyKey"] == "turn-1-f1"
    assert "interrupted by a freeze" in again["message"] and "Do it." in again["message"]


async def test_a_driver_frozen_before_it_admits_admits_nothing() -> None:
    wire = StandInHarness(turns=[[]], settle=["completed"])
    store = MemoryStore()
    async with wire.client() as client:
        driver = SessionDriver(client, store, AGENT, session(), "c1")
        await driver.interrupt("freeze")
        outcome = await driver.run()
    assert wire.admissions == [] and outcome.phase == "Pending"


# --------------------------------------------------------------------------------- the CLI


def test_the_cli_names_one_freeze_per_scope() -> None:
    made = freeze_manifest("session", "fix-bug", "team", "why")
    assert made["metadata"] == {"name": "session-fix-bug", "namespace": "team"}
    assert made["spec"] == {"scope": {"session": "fix-bug"}, "frozen": True, "reason": "why"}
    Freeze.model_validate(made)  # what the CLI sends is a valid Freeze
    assert freeze_manifest("namespace", None, "team", "")["spec"]["scope"] == {"namespace": True}
    long = freeze_name("session", "x" * 253)
    assert len(long) <= 253 and long != freeze_name("session", "x" * 252 + "y")
    with pytest.raises(ValueError, match="takes no name"):
        freeze_manifest("namespace", "team", "team", "")
    with pytest.raises(ValueError, match="needs a name"):
        freeze_manifest("agent", None, "team", "")
