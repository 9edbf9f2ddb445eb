"""What the turn driver's progress means for a Session: its status and its Kubernetes Events.

The driver saves a `DriverState` at every step; the operator's store turns that into the
Session's status through `status_with_driver_state`, and the driver's own events into
Kubernetes Events through `event_for`.
"""

from __future__ import annotations

from typing import Any

from corral_api.kinds import SessionStatus, Usage

from ..driver import DriverState
from .session import PlannedEvent, SandboxState, session_conditions

_MESSAGE_LIMIT = 1000


def status_with_driver_state(
    old: dict[str, Any],
    state: DriverState,
    sandbox: SandboxState,
    *,
    now: str,
    generation: int,
    usage: Usage | None = None,
    reason: str | None = None,
    at_end: SandboxState = "kept",
) -> dict[str, Any]:
    """The Session status after the driver saved `state`: its fields over the old status.

    `usage` is the custodian's record when one was just read; the driver's own sum of what the
    harness reported never reaches the status (docs/decisions/0062), so without a fresh record
    the status keeps the last one. `reason` names why the session ended when the store, not the
    driver, ended it (BudgetExceeded). `at_end` is the sandbox once the session has ended:
    "kept" until the planner's next pass releases it (or keeps it), or "released" when that
    pass will delete the pod at once and write nothing (no archive first, no keepSandbox).
    """
    previous = SessionStatus.model_validate(old or {})
    merged = previous.model_copy(
        update={
            "phase": state.phase,
            "turns": state.turns,
            "ledger": state.ledger,
            "last_settlement": state.last_settlement,
            "last_turn": state.last_turn or previous.last_turn,
            "usage": usage if usage is not None else previous.usage,
            "evaluation_turns": state.evaluation_turns,
            "freeze_interruptions": state.freeze_interruptions,
            "resume_interruptions": state.resume_interruptions,
            "output": state.output if state.output is not None else previous.output,
            "message": state.message,
            "answer": state.answer,
            "wake_at": state.wake_at,
            "woken_at": state.woken_at,
            "waiting_for": state.waiting_for,
            "reported_children": state.reported_children,
            "question": state.question,
            "replies_read": state.replies_read,
            "plan": state.plan or previous.plan,
            "started_at": state.started_at,
            "finished_at": state.finished_at,
        }
    )
    if state.finished and sandbox == "ready":
        sandbox = at_end
    return session_conditions(merged, sandbox, now=now, generation=generation, reason=reason).wire()


def driver_state_from_status(status: dict[str, Any] | None) -> DriverState:
    return DriverState.model_validate(status or {})


def _clip(text: str) -> str:
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


def event_for(event: dict[str, Any]) -> PlannedEvent | None:
    """The Kubernetes Event for one of the driver's events; None for wire chatter."""
    if event.get("source") != "driver":
        return None
    kind = event.get("type")
    turn = event.get("turn")
    if kind == "admitted":
        return PlannedEvent(
            "Normal", "TurnAdmitted", f"turn {turn} admitted as {event.get('submissionId')}"
        )
    if kind == "settled":
        status = event.get("status")
        usage = event.get("usage") or {}
        text = f"turn {turn} settled {status}"
        if event.get("error"):
            text += f": {event['error']}"
        if usage:
            text += f" (tokens in {usage.get('input', 0)}, out {usage.get('output', 0)})"
        ok = status in ("completed", "ended")
        settled = PlannedEvent("Normal" if ok else "Warning", "TurnSettled", _clip(text))
        evaluation = event.get("evaluation")
        if evaluation is None:
            return settled
        verdict = "passed" if evaluation.get("passed") else "failed"
        return PlannedEvent(
            "Normal" if evaluation.get("passed") else "Warning",
            "EvaluationPassed" if evaluation.get("passed") else "EvaluationFailed",
            _clip(f"{text}; evaluation {verdict}: {evaluation.get('summary', '')}"),
        )
    # "finished" has no Event of its own: the phase it ends in is `Phase<Phase>`'s, written
    # with the same message when the store saves it (one Event per Session less).
    return None
