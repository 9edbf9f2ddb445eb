"""The last turn's ledger in a Session's status, and the runaway watch's reason."""

from __future__ import annotations

from corral_api.kinds import LastTurn
from corral_api.wire import SettledEvent
from corral_operator.driver import DriverState
from corral_operator.driver._state import last_turn_of
from corral_operator.planning.session import plan_session
from corral_operator.planning.turns import status_with_driver_state
from tests._objects import agent_body, session_body

from .test_session_planner import NOW, SETTINGS, _cond, _finished

STAMP = "2026-01-01T00:00:00Z"
RECEIPT = {
    "requestedLoop": "auto",
    "handler": "reactive",
    "route": "reactive",
    "toolsRun": ["bash", "bash", "edit"],
    "toolsBlocked": ["write"],
    "tokensByLayer": {"classifier": 10, "planner": 0, "reactive": 200, "executor": 0},
    "outcome": "partial",
    "phasePath": ["understand", "choose_route", "execute", "failed"],
    "model": "corral-scripted",
    "thinkingLevel": "medium",
    "steps": 5,
    "contextTokens": {"identity": 12},
}


def _settled(**extra: object) -> SettledEvent:
    body = {"offset": 9, "submissionId": "sub-1", "status": "failed", "receipt": RECEIPT}
    return SettledEvent.model_validate({**body, **extra})


def test_the_settled_receipt_becomes_the_last_turn_summary() -> None:
    settled = _settled(error={"type": "runaway", "message": "over 4 steps"})
    last = last_turn_of(settled, 3)
    assert last is not None
    assert (last.turn, last.route, last.handler, last.outcome) == (
        3,
        "reactive",
        "reactive",
        "partial",
    )
    assert (last.tools_run, last.tools_blocked, last.tokens) == (3, 1, 210)
    assert last.error_type == "runaway" and last.phase_path[-1] == "failed"
    status = status_with_driver_state(
        {}, DriverState(last_turn=last), "ready", now=STAMP, generation=1
    )
    assert status["lastTurn"]["outcome"] == "partial" and status["lastTurn"]["toolsRun"] == 3
    assert LastTurn.model_validate(status["lastTurn"]) == last  # the CRD's shape


def test_a_turn_that_never_started_keeps_the_previous_summary() -> None:
    assert last_turn_of(_settled(receipt=None), 4) is None
    earlier = last_turn_of(_settled(), 3)
    kept = status_with_driver_state(
        {"lastTurn": earlier.model_dump(by_alias=True) if earlier else None},
        DriverState(),
        "ready",
        now=STAMP,
        generation=1,
    )
    assert kept["lastTurn"]["turn"] == 3


def test_a_runaway_turn_fails_the_session_with_its_own_reason() -> None:
    failed = {
        "lastSettlement": {
            "submissionId": "s",
            "status": "failed",
            "turn": 2,
            "error": "runaway: the turn started more than 200 tool calls",
        }
    }
    plan = plan_session(
        session_body(status=_finished("Failed", **failed)), agent_body(), None, SETTINGS, NOW
    )
    assert _cond(plan.status, "Failed")["reason"] == "TurnRunaway"
