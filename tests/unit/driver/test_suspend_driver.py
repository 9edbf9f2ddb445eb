"""The driver under a suspend (docs/turns.md, "Suspend and resume"): `afterTurn` lets the turn
in flight settle as usual and admits nothing after it; `now` aborts it with cause `suspend`, and
the driver of the resumed Session continues it under its number, saying why it stopped."""

from __future__ import annotations

import asyncio

import pytest

from corral_operator.driver import SUSPEND_CAUSE, DriverState, SessionDriver

from .test_session_driver import AGENT, MemoryStore, StandInHarness, session

pytestmark = pytest.mark.timeout(10)

TOOL = {"type": "tool_start", "toolUseId": "t", "name": "bash", "input": {}}


async def test_after_turn_the_turn_settles_and_nothing_more_is_admitted() -> None:
    # Turn 1 fails its check: unsuspended, the driver would admit a follow-up at once.
    wire = StandInHarness(turns=[[], []], settle=["completed", "completed"], check_exit=[1, 0])
    store = MemoryStore()
    spec = session(evaluation={"criteria": {"command": "make test"}, "turnBudget": 3})
    async with wire.client() as client:
        driver = SessionDriver(client, store, AGENT, spec, "c1")
        driver.hold_after_turn()
        held = await driver.run()
        assert len(wire.admissions) == 1 and wire.aborts == []
        assert held.phase == "Running" and held.turns == 1  # counted: it finished
        state: DriverState = store.saved[-1]
        assert state.ledger is None and state.freeze_interruptions == 0

        # Resumed: the next driver admits turn 2, the follow-up the suspend held back.
        outcome = await SessionDriver(client, store, AGENT, spec, "c1").run()
    assert outcome.phase == "Succeeded" and outcome.turns == 2
    assert wire.admissions[1]["turn"] == 2 and wire.admissions[1]["idempotencyKey"] == "turn-2"


async def test_now_aborts_the_turn_which_continues_after_the_resume() -> None:
    wire = StandInHarness(turns=[[TOOL], []], settle=["on_abort", "completed"])
    store = MemoryStore()
    async with wire.client() as client:
        driver = SessionDriver(client, store, AGENT, session(), "c1")
        running = asyncio.create_task(driver.run())
        while not wire.admissions:
            await asyncio.sleep(0.005)
        await driver.interrupt(SUSPEND_CAUSE)
        held = await asyncio.wait_for(running, 5)
        assert wire.aborts == [{"cause": "suspend", "submissionId": "s1"}]
        assert held.phase == "Running" and "suspend" in held.message
        state = store.saved[-1]
        assert state.turns == 0 and state.ledger is None
        assert state.last_settlement is not None
        assert (state.last_settlement.error or "").startswith("suspend:")

        outcome = await SessionDriver(client, store, AGENT, session(), "c1").run()
    assert outcome.phase == "Succeeded" and outcome.turns == 1
    again = wire.admissions[1]
    assert again["turn"] == 1 and again["idempotencyKey"] == "turn-1-f1"
    assert "suspended" in again["message"] and "Do it." in again["message"]
    assert "freeze" not in again["message"]
