"""The operator's side of observability that needs no cluster: its switches, the log format it
gives each sandbox, and the Events it plans for a Session's story (phase changes, approvals,
Evidence verdicts)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from corral_operator.builders.podbuilder import build_sandbox
from corral_operator.driver import DriverState
from corral_operator.main import parse_args, settings_from
from corral_operator.planning.approval import decided_on_session, requested_on_session
from corral_operator.planning.evidence import verdict_on_session
from corral_operator.planning.session import PlannedEvent
from corral_operator.session.store import SessionStatusStore, phase_event
from tests._objects import agent, session
from tests.unit.operator.test_podbuilder import CREDENTIAL, SETTINGS, TOKEN
from tests.unit.operator.test_store import FakeKube


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_the_log_format_flag_reaches_the_harness_and_the_custodian_only() -> None:
    settings = settings_from(parse_args(["-A", "--log-format", "json"]))
    assert settings.log_format == "json"
    pod = build_sandbox(agent(), session(), replace(SETTINGS, log_format="json"), TOKEN, CREDENTIAL)
    containers = {c["name"]: _env(c) for c in pod.pod["spec"]["containers"]}
    assert containers["harness"]["CORRAL_LOG_FORMAT"] == "json"
    assert containers["custodian"]["CORRAL_LOG_FORMAT"] == "json"
    assert "CORRAL_LOG_FORMAT" not in containers["tools"]  # the agent's own container: nothing
    text = build_sandbox(agent(), session(), SETTINGS, TOKEN, CREDENTIAL).pod
    assert all("CORRAL_LOG_FORMAT" not in _env(c) for c in text["spec"]["containers"])


def test_the_log_format_and_metrics_address_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CORRAL_LOG_FORMAT", "json")
    monkeypatch.setenv("CORRAL_METRICS_ADDR", ":9090")
    args = parse_args(["-A"])
    assert (args.log_format, args.metrics_addr) == ("json", "0.0.0.0:9090")


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [("--log-format", "xml", "must be json or text"), ("--metrics-addr", "9090", "HOST:PORT")],
)
def test_bad_switches_are_refused_naming_them(
    flag: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["-A", flag, value])
    err = capsys.readouterr().err
    assert flag in err and said in err


def test_the_store_tells_each_phase_change_it_writes_once() -> None:
    kube = FakeKube({"phase": "Pending"})
    told: list[PlannedEvent] = []
    store = SessionStatusStore(kube, "a", "s", on_phase=told.append)  # type: ignore[arg-type]

    async def drive() -> None:
        state = await store.load()
        state.phase, state.message = "Running", "turn 1 is running"
        await store.save(state)
        await store.save(state)  # the same status again: no second Event
        state.phase, state.message = "Failed", "turn 1 failed"
        await store.save(state)

    asyncio.run(drive())
    assert [(e.type, e.reason) for e in told] == [
        ("Normal", "PhaseRunning"),
        ("Warning", "PhaseFailed"),
    ]
    assert told[0].message == "Pending -> Running: turn 1 is running"


def test_a_phase_event_is_named_by_the_phase_it_enters() -> None:
    event = phase_event("Running", "WaitingForHuman", None)
    assert (event.type, event.reason, event.message) == (
        "Normal",
        "PhaseWaitingForHuman",
        "Running -> WaitingForHuman",
    )
    assert DriverState().phase == "Pending"  # where the store's first change starts from


def _approval(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "s-land-1"},
        "spec": {"action": {"tool": "land"}, "reason": "merge the fix"},
        **({"status": status} if status else {}),
    }


def test_the_session_hears_of_its_approval_and_of_the_decision() -> None:
    asked = requested_on_session(_approval())
    assert (asked.reason, asked.message) == (
        "ApprovalRequested",
        "Approval s-land-1 asks a person to allow land: merge the fix",
    )
    assert decided_on_session(_approval()) is None
    assert decided_on_session(_approval(decision="Pending")) is None
    approved = decided_on_session(_approval(decision="Approved", decidedBy="alice"))
    assert approved is not None and (approved.type, approved.reason) == (
        "Normal",
        "ApprovalApproved",
    )
    assert "by alice" in approved.message
    denied = decided_on_session(_approval(decision="Denied", decidedBy="bob", comment="not now"))
    assert denied is not None and (denied.type, denied.reason) == ("Warning", "ApprovalDenied")
    assert denied.message.endswith("(not now)")


@pytest.mark.parametrize(("verdict", "kind"), [("Pass", "Normal"), ("Fail", "Warning")])
def test_an_evidence_verdict_is_told_to_its_session(verdict: str, kind: str) -> None:
    evidence = {
        "metadata": {"name": "unit-abc"},
        "spec": {"check": "unit", "revision": "0123456789abcdef" * 2 + "01234567"},
    }
    event = verdict_on_session(evidence, verdict)
    assert (event.type, event.reason) == (kind, f"Evidence{verdict}")
    assert event.message == f"Evidence unit-abc: check 'unit' at 0123456789ab: {verdict}"
