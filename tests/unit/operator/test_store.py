"""The Session status store: usage is the custodian's record, and a spent budget ends the
session `Failed` with reason `BudgetExceeded` before the driver can admit another turn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from corral_api.kinds import SettlementRecord, Usage
from corral_api.wire import CustodianUsage, WireUsage
from corral_operator.custodianclient import CustodianUnavailable
from corral_operator.driver import DriverState
from corral_operator.planning.patch import merge_patch
from corral_operator.session.store import BudgetExceededStop, SessionStatusStore


class FakeKube:
    """What the store calls: get the Session, merge-patch its status."""

    def __init__(self, status: dict[str, Any] | None = None) -> None:
        self.body: dict[str, Any] = {
            "metadata": {"name": "s", "generation": 1},
            "status": status or {},
        }
        self.patches: list[dict[str, Any]] = []

    async def get(self, path: str) -> dict[str, Any]:
        return self.body

    async def patch_status(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(patch)
        status = self.body["status"]
        _apply(status, patch)
        return {"status": status}


def _apply(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _apply(target[key], value)
        else:
            target[key] = value


class Reader:
    def __init__(self, *records: CustodianUsage | Exception) -> None:
        self.records = list(records)
        self.calls = 0

    async def __call__(self) -> CustodianUsage:
        self.calls += 1
        record = self.records.pop(0)
        if isinstance(record, Exception):
            raise record
        return record


def _record(output: int, exceeded: bool = False, reason: str | None = None) -> CustodianUsage:
    return CustodianUsage(
        usage=WireUsage(input=100, output=output, cost=0.01), exceeded=exceeded, reason=reason
    )


def _settled(state: DriverState, submission: str, status: str = "completed") -> DriverState:
    state.turns += 1
    state.last_settlement = SettlementRecord(
        submission_id=submission,
        status=status,  # type: ignore[arg-type]
        turn=state.turns,
    )
    return state


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_usage_is_the_custodians_record_never_the_harnesss() -> None:
    kube = FakeKube()
    reader = Reader(_record(42))
    store = SessionStatusStore(kube, "ns", "s", reader)  # type: ignore[arg-type]

    async def go() -> None:
        state = await store.load()
        state.phase = "Running"
        await store.save(state)  # no settlement yet: nothing read
        assert reader.calls == 0
        _settled(state, "sub-1")
        # The harness said it spent a fortune; the driver summed it into its own state.
        state.usage = Usage(input_tokens=10**9, output_tokens=10**9, cost=9999.0)
        await store.save(state)

    _run(go())
    assert reader.calls == 1
    usage = kube.body["status"]["usage"]
    assert usage["inputTokens"] == 100 and usage["outputTokens"] == 42
    assert usage["cost"] == 0.01


def test_the_record_is_read_after_each_settlement_and_once_on_finishing() -> None:
    kube = FakeKube()
    reader = Reader(_record(1), _record(2), _record(3))
    store = SessionStatusStore(kube, "ns", "s", reader)  # type: ignore[arg-type]

    async def go() -> None:
        state = await store.load()
        state.phase = "Running"
        await store.save(_settled(state, "a"))
        await store.save(state)  # same settlement: not read again
        await store.save(_settled(state, "b"))
        state.phase = "Succeeded"
        await store.save(state)  # finishing reads once more
        await store.save(state)

    _run(go())
    assert reader.calls == 3
    assert kube.body["status"]["usage"]["outputTokens"] == 3


def test_an_unreadable_record_keeps_the_last_figure() -> None:
    kube = FakeKube({"usage": {"inputTokens": 7}})
    reader = Reader(CustodianUnavailable("connection refused"))
    store = SessionStatusStore(kube, "ns", "s", reader)  # type: ignore[arg-type]

    async def go() -> None:
        state = await store.load()
        state.phase = "Running"
        await store.save(_settled(state, "a"))

    _run(go())
    assert kube.body["status"]["usage"]["inputTokens"] == 7


def test_a_spent_budget_ends_the_session_and_stops_the_driver() -> None:
    kube = FakeKube()
    reader = Reader(_record(5, exceeded=True, reason="token budget of 100 spent"))
    store = SessionStatusStore(kube, "ns", "s", reader)  # type: ignore[arg-type]

    async def go() -> None:
        state = await store.load()
        state.phase = "Running"  # the driver decided to go on
        with pytest.raises(BudgetExceededStop, match="token budget of 100 spent"):
            await store.save(_settled(state, "a"))

    _run(go())
    status = kube.body["status"]
    assert status["phase"] == "Failed"
    assert "token budget of 100 spent" in status["message"]
    assert status["finishedAt"]
    assert _cond(status, "Failed")["reason"] == "BudgetExceeded"


def test_a_session_that_already_failed_gets_the_budget_reason_without_a_stop() -> None:
    kube = FakeKube()
    reader = Reader(_record(5, exceeded=True))
    store = SessionStatusStore(kube, "ns", "s", reader)  # type: ignore[arg-type]

    async def go() -> None:
        state = await store.load()
        state.phase = "Failed"
        state.message = "turn 1 failed (provider_error: 429)"
        await store.save(_settled(state, "a", "failed"))  # no exception: the driver is done

    _run(go())
    assert _cond(kube.body["status"], "Failed")["reason"] == "BudgetExceeded"


def test_a_succeeded_session_stays_succeeded() -> None:
    kube = FakeKube()
    store = SessionStatusStore(kube, "ns", "s", Reader(_record(5, exceeded=True)))  # type: ignore[arg-type]

    async def go() -> None:
        state = await store.load()
        state.phase = "Succeeded"
        await store.save(_settled(state, "a"))

    _run(go())
    assert kube.body["status"]["phase"] == "Succeeded"


def test_patches_stay_minimal() -> None:
    kube = FakeKube()
    store = SessionStatusStore(kube, "ns", "s")  # type: ignore[arg-type]

    async def go() -> None:
        state = await store.load()
        state.phase = "Running"
        await store.save(state)
        await store.save(state)

    _run(go())
    assert len(kube.patches) == 1
    assert merge_patch(kube.body["status"], kube.body["status"]) == {}


def test_the_planned_status_goes_out_with_the_first_save() -> None:
    """A pass about to drive leaves its status (the harness is ready) to the store: the first
    save writes it together with the driver's own change, in one patch."""
    kube = FakeKube({"phase": "Pending", "message": "waiting"})
    planned = {"phase": "Pending", "message": "the harness is ready", "podName": "p"}
    store = SessionStatusStore(kube, "ns", "s", planned=planned)  # type: ignore[arg-type]

    async def scenario() -> None:
        state = await store.load()
        assert state.phase == "Pending"
        state.phase = "Running"
        await store.save(state)
        await store.write_planned()  # nothing left: the save carried it

    asyncio.run(scenario())
    assert len(kube.patches) == 1, kube.patches
    assert kube.body["status"]["podName"] == "p" and kube.body["status"]["phase"] == "Running"


def test_the_planned_status_is_written_when_the_driver_saved_nothing() -> None:
    kube = FakeKube({"phase": "Pending", "message": "waiting"})
    planned = {"phase": "Pending", "message": "the harness is ready"}
    store = SessionStatusStore(kube, "ns", "s", planned=planned)  # type: ignore[arg-type]

    async def scenario() -> None:
        await store.load()
        await store.write_planned()
        await store.write_planned()  # once

    asyncio.run(scenario())
    assert kube.patches == [{"message": "the harness is ready"}]
