"""The one-shot wake in the driver: an accepted turn waits, the wake is admitted once when due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from corral_api.kinds import AgentSpec
from corral_operator.driver import DriverState, SessionDriver, seconds_until_wake
from corral_operator.driver._state import Decision
from corral_operator.driver._wake import clip_answer, with_wake

from .test_session_driver import AGENT, MemoryStore, StandInHarness, session

pytestmark = pytest.mark.timeout(10)

WAKE = {"afterSeconds": 600, "message": "Wake up: is the nightly build green?"}


def _past(seconds: int = 5) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_an_accepted_turn_waits_for_the_wake_instead_of_ending() -> None:
    wire = StandInHarness(turns=[[]], settle=["completed"], texts=["First pass done."])
    store = MemoryStore()
    before = datetime.now(UTC)
    async with wire.client() as client:
        outcome = await SessionDriver(client, store, AGENT, session(wake=WAKE), "c1").run()
    assert outcome.phase == "WaitingForWake" and outcome.turns == 1
    saved = store.saved[-1]
    assert saved.finished_at is None and saved.woken_at is None
    assert saved.answer == "First pass done."
    assert saved.wake_at is not None and "waiting for the one-shot wake" in (saved.message or "")
    left = seconds_until_wake(saved, before)
    assert 599 <= left <= 601

    # Run again before it is due (an operator pass, a restart): nothing is admitted.
    async with wire.client() as client:
        again = await SessionDriver(client, store, AGENT, session(wake=WAKE), "c1").run()
    assert again.phase == "WaitingForWake" and len(wire.admissions) == 1


async def test_a_due_wake_is_admitted_once_as_the_next_turn_then_the_session_ends() -> None:
    state = DriverState(phase="WaitingForWake", turns=1, wake_at=_past(), answer="earlier")
    wire = StandInHarness(turns=[[]], settle=["completed"], texts=["All green."])
    store = MemoryStore(state)
    async with wire.client() as client:
        outcome = await SessionDriver(client, store, AGENT, session(wake=WAKE), "c1").run()
    assert outcome.phase == "Succeeded" and outcome.turns == 2
    (admitted,) = wire.admissions
    assert admitted["message"] == WAKE["message"] and admitted["turn"] == 2
    # The wake is recorded in the same write as the wake turn's ledger: fired once.
    first_save = store.saved[0]
    assert first_save.ledger is not None and first_save.woken_at is not None
    final = store.saved[-1]
    assert final.finished_at is not None and final.answer == "All green."


async def test_a_wake_whose_ledger_write_was_lost_is_admitted_again_under_the_same_key() -> None:
    class LosesFirstSave(MemoryStore):
        async def save(self, state: DriverState) -> None:
            if not self.saved and state.ledger is not None:
                self.saved.append(state.model_copy(deep=True))
                raise OSError("the API server went away")  # nothing written
            await super().save(state)

    store = LosesFirstSave(DriverState(phase="WaitingForWake", turns=1, wake_at=_past()))
    wire = StandInHarness(turns=[[], []], settle=["completed", "completed"])
    async with wire.client() as client:
        with pytest.raises(OSError):
            await SessionDriver(client, store, AGENT, session(wake=WAKE), "c1").run()
        outcome = await SessionDriver(client, store, AGENT, session(wake=WAKE), "c1").run()
    assert outcome.phase == "Succeeded"
    # The harness deduplicates admissions by this key: the wake runs once.
    assert [a["idempotencyKey"] for a in wire.admissions] == ["turn-2", "turn-2"]


async def test_a_failed_turn_ends_the_session_without_waiting() -> None:
    wire = StandInHarness(turns=[[]], settle=["failed"])
    store = MemoryStore()
    async with wire.client() as client:
        outcome = await SessionDriver(client, store, AGENT, session(wake=WAKE), "c1").run()
    assert outcome.phase == "Failed" and store.saved[-1].wake_at is None


def test_no_turn_left_means_no_wake() -> None:
    agent = AgentSpec.model_validate({"identity": "x", "model": "m", "limits": {"maxTurns": 1}})
    done = Decision("finish", "Succeeded", "turn 1 completed")
    decision, due = with_wake(
        done, DriverState(turns=1), session(wake=WAKE), agent, datetime.now(UTC)
    )
    assert decision.phase == "Succeeded" and due is None
    assert "no turn left for the wake" in decision.message


def test_a_spent_wake_does_not_wait_again() -> None:
    done = Decision("finish", "Succeeded", "turn 2 completed")
    state = DriverState(turns=2, woken_at=_past())
    decision, due = with_wake(done, state, session(wake=WAKE), AGENT, datetime.now(UTC))
    assert decision is done and due is None


def test_the_answer_kept_is_the_end_of_a_long_answer() -> None:
    long = "a" * 5000 + "THE END"
    kept = clip_answer(long)
    assert kept is not None and len(kept) == 4000 and kept.endswith("THE END")
    assert clip_answer("  \n") is None
