"""The one-shot wake (seed 003, docs/wake.md), as pure functions.

A Session with `spec.wake` does not end when a turn is accepted: it waits in `WaitingForWake`
until `wakeAt` (the accepted turn's end plus `afterSeconds`), then `wake.message` is admitted
as the next turn. The wake fires once: `wokenAt` records it, and the turn after it ends the
session as any turn would. Both times live in the state the store keeps (the Session's status),
so a restarted operator computes the same due time instead of remembering a sleep.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from corral_api.kinds import ANSWER_LIMIT, AgentSpec, SessionPhase, SessionSpec
from corral_api.timestamps import parse_rfc3339, rfc3339

from ._state import Decision, DriverState

WAITING_FOR_WAKE: Final[SessionPhase] = "WaitingForWake"


time_text = rfc3339
parse_time_text = parse_rfc3339


def with_wake(
    decision: Decision, state: DriverState, session: SessionSpec, agent: AgentSpec, now: datetime
) -> tuple[Decision, str | None]:
    """`decision` held open for the wake, and the wake's due time; or both unchanged.

    Only an accepted turn waits (a failure ends the session as it would without a wake), only
    once (`wokenAt` set means the wake is spent), and only when a turn is left for the wake to
    use: waiting for a turn the limit would refuse would end Failed what had succeeded.
    """
    wake = session.wake
    if wake is None or decision.action != "finish" or decision.phase != "Succeeded":
        return decision, None
    if state.woken_at is not None:
        return decision, None
    if agent.limits.max_turns - state.turns <= 0:
        note = f"{decision.message}; no turn left for the wake, so it does not fire"
        return Decision("finish", "Succeeded", note), None
    due = time_text(now + timedelta(seconds=wake.after_seconds))
    text = f"{decision.message}; waiting for the one-shot wake at {due}"
    return Decision("finish", WAITING_FOR_WAKE, text), due


def seconds_until_wake(state: DriverState, now: datetime) -> float:
    """How long until the wake is due: 0 when due (or when its time is unreadable: fire rather
    than wait forever), negative never."""
    due = parse_time_text(state.wake_at)
    if due is None:
        return 0.0
    return max((due - now).total_seconds(), 0.0)


def clip_answer(text: str) -> str | None:
    """What status keeps of a turn's final answer: its end, where conclusions are."""
    text = text.strip()
    if not text:
        return None
    if len(text) <= ANSWER_LIMIT:
        return text
    return "..." + text[-(ANSWER_LIMIT - 3) :]
