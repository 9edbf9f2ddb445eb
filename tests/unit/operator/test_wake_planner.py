"""The Session planner and the one-shot wake: the due time in status decides, not a sleep."""

from __future__ import annotations

from typing import Any

from corral_operator.planning.session import plan_session
from tests._objects import agent_body, sandbox_pod, session_body

from .test_session_planner import NOW, SETTINGS, _cond

WAKE = {"afterSeconds": 60, "message": "Wake up."}


def _waiting(wake_at: str, **spec: Any) -> dict[str, Any]:
    status = {
        "phase": "WaitingForWake",
        "turns": 1,
        "podName": "corral-fix-bug",
        "wakeAt": wake_at,
        "message": f"turn 1 completed; waiting for the one-shot wake at {wake_at}",
    }
    return session_body(status=status, **spec)


def test_a_session_waiting_for_its_wake_requeues_until_due_and_does_not_drive() -> None:
    plan = plan_session(
        _waiting("2026-11-29T12:00:42Z", wake=WAKE), agent_body(), sandbox_pod(True), SETTINGS, NOW
    )
    assert not plan.drive and not plan.delete_pod
    assert plan.requeue_after == 42.0
    assert plan.status["phase"] == "WaitingForWake"
    progressing = _cond(plan.status, "Progressing")
    assert progressing["status"] == "True" and progressing["reason"] == "WaitingForWake"
    assert "2026-11-29T12:00:42Z" in progressing["message"]
    assert "Succeeded" not in {c["type"] for c in plan.status["conditions"]}


def test_a_due_wake_lets_the_driver_admit_it() -> None:
    plan = plan_session(
        _waiting("2026-11-29T11:59:59Z", wake=WAKE), agent_body(), sandbox_pod(True), SETTINGS, NOW
    )
    assert plan.drive and plan.harness_url == "http://127.0.3.4:8080"


def test_a_wake_taken_out_of_the_spec_ends_the_session() -> None:
    plan = plan_session(
        _waiting("2026-11-29T13:00:00Z"), agent_body(), sandbox_pod(True), SETTINGS, NOW
    )
    assert plan.status["phase"] == "Succeeded" and not plan.drive
    assert _cond(plan.status, "Succeeded")["reason"] == "Completed"
    assert "wake was removed" in plan.status["message"]


def test_a_wake_the_turn_limit_cannot_serve_is_never_due() -> None:
    # The driver never waits without a turn left; a status written otherwise fails cleanly.
    plan = plan_session(
        _waiting("2026-11-29T11:00:00Z", wake=WAKE), agent_body(limits={"maxTurns": 1}),
        sandbox_pod(True), SETTINGS, NOW,
    )  # fmt: skip
    assert plan.status["phase"] == "Failed"
    assert _cond(plan.status, "Failed")["reason"] == "TurnLimitReached"
