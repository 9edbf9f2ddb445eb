"""SessionDriver's conversation with the wire, against a stand-in harness.

The stand-in (an httpx MockTransport, named as such) plays scripted events per submission and
settles as the real harness would; the real harness is driven in tests/e2e_local. The stand-in
lets these tests reach turns the real one reaches only with a cluster: a pick that ends the
turn, an approval pending.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from corral_api.kinds import AgentSpec, SessionSpec
from corral_operator.driver import DriverState, SessionDriver
from corral_operator.wireclient import WireClient

pytestmark = pytest.mark.timeout(10)

AGENT = AgentSpec.model_validate({"identity": "x", "model": "claude-haiku-4-5"})


def session(**extra: Any) -> SessionSpec:
    return SessionSpec.model_validate(
        {"agentRef": "fixer", "task": "Do it.", "workspace": {"repo": "r"}, **extra}
    )


class MemoryStore:
    """A TurnStore in memory that keeps every saved state (a stand-in for the status store)."""

    def __init__(self, state: DriverState | None = None) -> None:
        self.saved: list[DriverState] = []
        self._state = state or DriverState()

    async def load(self) -> DriverState:
        return self._state.model_copy(deep=True)

    async def save(self, state: DriverState) -> None:
        self._state = state.model_copy(deep=True)
        self.saved.append(self._state)


@dataclass
class StandInHarness:
    """Plays `turns[i]` (a list of event dicts) for the i-th admission; `settle` ends each.

    `settle[i]` is a status, or "on_abort" to settle only when an abort arrives (with `ended`
    for `{cause: pick, submissionId}` naming the submission, `aborted` otherwise).
    """

    turns: list[list[dict[str, Any]]]
    settle: list[str]
    texts: list[str] = field(default_factory=list)
    check_exit: list[int] = field(default_factory=list)
    admissions: list[dict[str, Any]] = field(default_factory=list)
    aborts: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any] | None] = field(default_factory=list)

    def _emit(self, sub: str, kind: str, **fields: Any) -> None:
        self.events.append(
            {"offset": len(self.events), "type": kind, "submissionId": sub, **fields}
        )

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "POST" and path == "/agents/fixer/c1":
            index = len(self.admissions)
            self.admissions.append(json.loads(request.content))
            sub = f"s{index + 1}"
            offset = len(self.events)
            self._emit(sub, "submission_started")
            for event in self.turns[index]:
                self._emit(sub, event["type"], **{k: v for k, v in event.items() if k != "type"})
            if self.settle[index] != "on_abort":
                text = self.texts[index] if index < len(self.texts) else ""
                error = self.errors[index] if index < len(self.errors) else None
                extra = {"error": error} if error else {}
                self._emit(sub, "settled", status=self.settle[index], text=text, **extra)
            return httpx.Response(
                200,
                json={
                    "streamUrl": "/agents/fixer/c1/updates",
                    "offset": offset,
                    "submissionId": sub,
                },
            )
        if path == "/agents/fixer/c1/updates":
            offset = int(request.url.params["offset"])
            return httpx.Response(
                200, json={"events": self.events[offset:], "offset": len(self.events)}
            )
        if path == "/agents/fixer/c1/abort":
            body = json.loads(request.content or b"{}")
            self.aborts.append(body)
            sub = f"s{len(self.admissions)}"
            ended = body.get("cause") == "pick" and body.get("submissionId") == sub
            status = "ended" if ended else "aborted"
            error = None if ended else {"type": "submission_aborted", "message": "swept"}
            self._emit(sub, "settled", status=status, error=error, text="")
            return httpx.Response(200, json={"aborted": True})
        if path == "/checks":
            code = self.check_exit.pop(0)
            return httpx.Response(
                200, json={"exitCode": code, "output": f"exit {code}", "timedOut": False}
            )
        return httpx.Response(404, json={"error": "not_found", "reason": path})

    def client(self) -> WireClient:
        return WireClient(
            "http://stand-in",
            "fixer",
            poll_wait=0.01,
            backoff_initial=0.001,
            transport=httpx.MockTransport(self.handle),
        )


async def test_a_failed_check_admits_a_follow_up_turn_with_the_agent_and_dials() -> None:
    wire = StandInHarness(turns=[[], []], settle=["completed", "completed"], check_exit=[1, 0])
    store = MemoryStore()
    spec = session(
        evaluation={"criteria": {"command": "make test"}, "turnBudget": 3},
        overrides={"model": "claude-sonnet-4-5", "thinkingLevel": "high"},
    )
    async with wire.client() as client:
        outcome = await SessionDriver(client, store, AGENT, spec, "c1").run()
    assert outcome.phase == "Succeeded" and outcome.turns == 2
    first, second = wire.admissions
    assert first["message"] == "Do it." and first["turn"] == 1
    assert first["model"] == "claude-sonnet-4-5" and first["thinkingLevel"] == "high"
    assert first["agent"]["model"] == "claude-haiku-4-5"
    assert second["turn"] == 2 and "`make test` failed (exit 1)" in second["message"]
    # The ledger was saved before each wait and cleared with each settlement.
    ledgers = [s.ledger.submission_id if s.ledger else None for s in store.saved]
    assert ledgers == ["s1", None, "s2", None]


async def test_a_pick_that_ended_the_turn_is_swept_with_its_cause() -> None:
    pick = {
        "type": "tool_end",
        "toolUseId": "t1",
        "name": "mcp__corral__wait_for_children",
        "isError": False,
        "result": "waiting",
        "endsTurn": True,
    }
    wire = StandInHarness(turns=[[pick]], settle=["on_abort"])
    store = MemoryStore()
    spec = session(evaluation={"criteria": {"substring": "x"}})
    async with wire.client() as client:
        outcome = await SessionDriver(client, store, AGENT, spec, "c1").run()
    assert wire.aborts == [{"cause": "pick", "submissionId": "s1"}]
    assert outcome.phase == "WaitingForChildren"
    assert store.saved[-1].last_settlement is not None
    assert store.saved[-1].last_settlement.status == "ended"
    assert store.saved[-1].evaluation_turns == 0  # a handed-over turn is not judged


async def test_abort_mid_turn_settles_aborted_and_stops_without_judging() -> None:
    wire = StandInHarness(
        turns=[[{"type": "tool_start", "toolUseId": "t", "name": "bash", "input": {}}]],
        settle=["on_abort"],
    )
    store = MemoryStore()
    spec = session(evaluation={"criteria": {"command": "make test"}})
    async with wire.client() as client:
        driver = SessionDriver(client, store, AGENT, spec, "c1")
        running = asyncio.create_task(driver.run())
        while not wire.admissions:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)
        await driver.abort()
        outcome = await asyncio.wait_for(running, 5)
    assert wire.aborts == [{"submissionId": "s1"}]  # no cause: it settles aborted
    assert outcome.phase == "Stopped"
    final = store.saved[-1]
    assert final.ledger is None and final.finished_at is not None
    assert final.last_settlement is not None and final.last_settlement.status == "aborted"


async def test_a_pending_approval_shows_as_waiting_for_a_human_then_running_again() -> None:
    turn: list[dict[str, Any]] = [
        {"type": "approval_requested", "approvalId": "a1", "toolUseId": "t1", "name": "land"},
        {"type": "tool_end", "toolUseId": "t1", "name": "land", "isError": False, "result": ""},
    ]
    wire = StandInHarness(turns=[turn], settle=["completed"])
    store = MemoryStore()
    async with wire.client() as client:
        outcome = await SessionDriver(client, store, AGENT, session(), "c1").run()
    phases = [s.phase for s in store.saved]
    assert phases == ["Running", "WaitingForHuman", "Running", "Succeeded"]
    assert store.saved[-1].finished_at is not None
    assert outcome.succeeded


async def test_a_decided_turn_that_was_never_admitted_is_admitted_after_a_restart() -> None:
    state = DriverState(
        phase="Running",
        turns=1,
        evaluation_turns=1,
        message="evaluation failed on turn 1: `make test` failed (exit 2)",
    )
    wire = StandInHarness(turns=[[]], settle=["completed"], check_exit=[0])
    store = MemoryStore(state)
    spec = session(evaluation={"criteria": {"command": "make test"}})
    async with wire.client() as client:
        outcome = await SessionDriver(client, store, AGENT, spec, "c1").run()
    assert len(wire.admissions) == 1
    assert wire.admissions[0]["turn"] == 2
    assert "`make test` failed (exit 2)" in wire.admissions[0]["message"]
    assert outcome.phase == "Succeeded" and outcome.turns == 2


async def test_a_substring_guard_reads_the_settled_text() -> None:
    wire = StandInHarness(
        turns=[[], []], settle=["completed", "completed"], texts=["not yet", "ALL DONE"]
    )
    spec = session(evaluation={"criteria": {"substring": "DONE"}, "turnBudget": 2})
    async with wire.client() as client:
        outcome = await SessionDriver(client, MemoryStore(), AGENT, spec, "c1").run()
    assert outcome.phase == "Succeeded" and outcome.turns == 2 and outcome.text == "ALL DONE"


@pytest.mark.parametrize("lost", ["sandbox_lost", "harness_stopped"])
async def test_a_turn_its_lost_pod_cut_short_is_admitted_again_once_with_a_note(lost: str) -> None:
    wire = StandInHarness(
        turns=[[], []],
        settle=["failed", "completed"],
        errors=[{"type": lost, "message": "the pod went"}, None],
    )
    store = MemoryStore()
    async with wire.client() as client:
        driver = SessionDriver(client, store, AGENT, session(), "c1", resumed_from="a" * 40)
        outcome = await driver.run()
    assert outcome.phase == "Succeeded" and outcome.turns == 1  # the lost attempt is no turn
    first, again = wire.admissions
    assert first["idempotencyKey"] == "turn-1" and again["idempotencyKey"] == "turn-1-resume-1"
    assert again["turn"] == 1 and again["runId"] == "c1.1-resume-1"
    assert "sandbox pod it ran in was lost" in again["message"]
    assert "aaaaaaaaaaaa" in again["message"]  # the revision the workspace is back at
    assert store.saved[-1].resume_interruptions == 1


async def test_a_turn_lost_before_its_admission_was_archived_is_admitted_again() -> None:
    # What `continuity.restore` writes when the ledger's admission is not in the archive.
    from corral_api.kinds import SettlementRecord

    lost = SettlementRecord(
        submission_id="gone", status="failed", turn=2,
        error="sandbox_lost: the sandbox pod was lost before this turn's admission was archived",
    )  # fmt: skip
    state = DriverState(phase="Running", turns=1, last_settlement=lost, resume_interruptions=1)
    wire = StandInHarness(turns=[[]], settle=["completed"])
    async with wire.client() as client:
        outcome = await SessionDriver(client, MemoryStore(state), AGENT, session(), "c1").run()
    assert outcome.phase == "Succeeded" and outcome.turns == 2
    (again,) = wire.admissions
    assert again["turn"] == 2 and again["idempotencyKey"] == "turn-2-resume-1"
    assert "the starting ref (nothing had been delivered)" in again["message"]


async def test_a_turn_admitted_by_an_earlier_operator_is_reattached_and_said_so() -> None:
    """The ledger names a submission an earlier operator admitted: nothing is admitted, the
    driver says it re-attached (so what that operator held for the turn is held again) and
    follows the turn to its settlement."""
    wire = StandInHarness(turns=[], settle=[])
    wire._emit("s1", "submission_started")
    wire._emit("s1", "settled", status="completed", text="done")
    state = DriverState.model_validate({
        "phase": "Running", "turns": 1, "startedAt": "2026-01-01T00:00:00Z",
        "ledger": {"streamUrl": "/agents/fixer/c1/updates", "offset": 0,
                   "submissionId": "s1", "turn": 1},
    })  # fmt: skip
    seen: list[dict[str, Any]] = []
    async with wire.client() as client:
        outcome = await SessionDriver(
            client, MemoryStore(state), AGENT, session(), "c1", seen.append
        ).run()
    assert outcome.phase == "Succeeded" and not wire.admissions
    ours = [(e["type"], e.get("turn")) for e in seen if e.get("source") == "driver"]
    assert ours[0] == ("reattached", 1) and ("admitted", 1) not in ours
