"""Suspend and resume as the Session planner decides them (docs/turns.md, "Suspend and
resume"): a turn in flight ends as spec.suspendMode says, a parked Session has no pod when an
archive can resume it (and keeps it idle when none can), and spec.suspend false brings it back
to the phase it was parked in, in a new pod that restores its conversation."""

from __future__ import annotations

from typing import Any

from corral_api.freeze import FrozenBy
from corral_operator.planning import reasons as R
from corral_operator.planning.session import SessionPlan, plan_session
from corral_operator.session.sandbox import resume_point
from tests._objects import agent_body, sandbox_pod, session_body

from .test_session_planner import ARCHIVING, NOW, SETTINGS

LEDGER = {"streamUrl": "/u", "offset": 0, "submissionId": "sub-1", "turn": 2}


def _running(**status: Any) -> dict[str, Any]:
    return {"phase": "Running", "podName": "corral-fix-bug", "turns": 1, **status}


def _plan(
    status: dict[str, Any],
    pod: dict[str, Any] | None,
    *,
    archive: bool = True,
    frozen_by: FrozenBy | None = None,
    **spec: Any,
) -> SessionPlan:
    body = session_body(status=status, **spec)
    settings = ARCHIVING if archive else SETTINGS
    return plan_session(body, agent_body(), pod, settings, NOW, frozen_by=frozen_by)


def _condition(plan: SessionPlan, type_: str) -> tuple[str, str] | None:
    found = [c for c in plan.status.get("conditions") or [] if c["type"] == type_]
    return (found[0]["status"], found[0]["reason"]) if found else None


def test_a_turn_in_flight_is_driven_to_its_end_as_the_suspend_mode_says() -> None:
    for mode in ("afterTurn", "now"):
        plan = _plan(_running(ledger=LEDGER), sandbox_pod(True), suspend=True, suspendMode=mode)
        assert (plan.drive, plan.suspend, plan.delete_pod, plan.suspend_pod) == (
            True, mode, False, False,
        )  # fmt: skip
        assert plan.status["phase"] == "Running"
        assert _condition(plan, "Suspended") == ("False", R.SUSPENDING)
        assert "turn 2" in plan.status["message"]


def test_a_freeze_wins_over_a_suspend_for_the_turn_in_flight() -> None:
    frozen = FrozenBy(freeze="audit", scope="namespace team-a", reason="audit")
    plan = _plan(_running(ledger=LEDGER), sandbox_pod(True), suspend=True, frozen_by=frozen)
    assert plan.frozen_by == frozen  # the loop interrupts it with cause `freeze`


def test_between_turns_the_session_is_parked_and_its_pod_goes_after_its_log() -> None:
    plan = _plan(_running(phase="WaitingForChildren"), sandbox_pod(True), suspend=True)
    status = plan.status
    assert (status["phase"], status["suspendedFrom"], status["suspensions"]) == (
        "Suspended", "WaitingForChildren", 1,
    )  # fmt: skip
    assert "podName" not in status
    # Released by the suspend step (the log read from this address first), not delete_pod.
    assert (plan.suspend_pod, plan.pod_ip, plan.delete_pod, plan.drive) == (
        True, "127.0.3.4", False, False,
    )  # fmt: skip
    assert _condition(plan, "Suspended") == ("True", R.SUSPENDED)
    assert _condition(plan, "Progressing") == ("False", R.SUSPENDED)
    assert _condition(plan, "Ready") == ("False", R.SANDBOX_RELEASED)
    assert [e.reason for e in plan.events] == ["PhaseSuspended"]


def test_a_parked_session_costs_nothing_and_writes_nothing_again() -> None:
    first = _plan(_running(), sandbox_pod(True), suspend=True)
    again = _plan(first.status, None, suspend=True)
    assert not (again.status_changed or again.create_sandbox or again.suspend_pod or again.drive)
    assert again.requeue_after is None and again.events == []
    assert again.status["suspensions"] == 1  # counted once


def test_a_pod_that_does_not_serve_goes_without_reading_its_log() -> None:
    plan = _plan(_running(ledger=LEDGER), sandbox_pod(False), suspend=True)
    assert (plan.status["phase"], plan.suspend_pod, plan.pod_ip) == ("Suspended", True, None)
    assert plan.status["ledger"] == LEDGER  # the resumed pod's restore settles it as lost


def test_without_an_archive_the_pod_is_kept_idle_and_nothing_is_counted() -> None:
    plan = _plan(_running(), sandbox_pod(True), archive=False, suspend=True)
    status = plan.status
    assert (status["phase"], status.get("suspensions", 0), status["podName"]) == (
        "Suspended", 0, "corral-fix-bug",
    )  # fmt: skip
    assert not (plan.suspend_pod or plan.delete_pod or plan.drive)
    assert "no archive" in status["message"]
    assert _condition(plan, "Ready") == ("True", R.SANDBOX_KEPT)
    # Resumed: the kept pod serves on, and no conversation is restored into it.
    back = _plan(status, sandbox_pod(True), archive=False)
    assert back.status["phase"] == "Running"
    assert resume_point(session_body(status=back.status)) is None


def test_false_again_resumes_in_the_phase_it_was_parked_in_with_a_new_pod() -> None:
    parked = _plan(_running(phase="WaitingForHuman"), sandbox_pod(True), suspend=True).status
    back = _plan(parked, None)
    assert (back.status["phase"], back.status.get("suspendedFrom")) == ("WaitingForHuman", None)
    assert _condition(back, "Suspended") == ("False", R.UNSUSPENDED)
    assert [e.reason for e in back.events][:1] == [R.UNSUSPENDED]
    created = _plan(back.status, None)
    assert created.create_sandbox and created.status["podName"] == "corral-fix-bug"
    # The new pod starts from the delivered revision and the usage, as after a lost pod.
    point = resume_point(session_body(status=created.status))
    assert point is not None and point.revision is None  # nothing delivered yet


def test_a_resume_waits_for_the_parked_pod_to_go_first() -> None:
    parked = _plan(_running(), sandbox_pod(True), suspend=True).status
    still = _plan(parked, sandbox_pod(True))  # suspend is false again; the pod is still there
    assert (still.status["phase"], still.suspend_pod, still.create_sandbox) == (
        "Suspended", True, False,
    )  # fmt: skip
    going = _plan(parked, sandbox_pod(True, deleting=True))
    assert (going.status["phase"], going.requeue_after) == ("Suspended", 1.0)


def test_a_session_suspended_before_its_pod_resumes_pending() -> None:
    parked = _plan({}, None, suspend=True)
    assert (parked.status["phase"], parked.status["suspendedFrom"]) == ("Suspended", "Pending")
    assert not parked.create_sandbox
    back = _plan(parked.status, None)
    assert back.status["phase"] == "Pending"
