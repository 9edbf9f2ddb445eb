"""The driver's judgement after a settlement: evaluation guard, turn limits, settlement meanings."""

from __future__ import annotations

import pytest

from corral_api.kinds import AgentSpec, SessionSpec
from corral_api.wire import SettledEvent, WireError
from corral_operator.driver import (
    DriverState,
    EvaluationResult,
    decide_after_settlement,
    evaluate_exit,
    evaluate_substring,
    needs_evaluation,
)

PASS = EvaluationResult(True, "`make test` passed (exit 0)")
FAIL = EvaluationResult(False, "`make test` failed (exit 1)", "1 failed, 2 passed")


def agent(max_turns: int = 20) -> AgentSpec:
    return AgentSpec.model_validate(
        {"identity": "x", "model": "m", "limits": {"maxTurns": max_turns}}
    )


def session(budget: int | None = 3, substring: bool = False) -> SessionSpec:
    spec: dict[str, object] = {"agentRef": "a", "task": "t", "workspace": {"repo": "r"}}
    if budget is not None:
        criteria = {"substring": "DONE"} if substring else {"command": "make test"}
        spec["evaluation"] = {"criteria": criteria, "turnBudget": budget}
    return SessionSpec.model_validate(spec)


def settled(status: str, error: str | None = None, text: str = "") -> SettledEvent:
    return SettledEvent(
        offset=5,
        submissionId="s1",
        status=status,
        error=WireError(type=error, message="boom") if error else None,
        text=text,
    )


def state(turns: int, evaluation_turns: int | None = None) -> DriverState:
    judged = turns if evaluation_turns is None else evaluation_turns
    return DriverState(phase="Running", turns=turns, evaluation_turns=judged)


def test_completed_without_a_guard_succeeds() -> None:
    d = decide_after_settlement(
        state=state(1), settled=settled("completed"), agent=agent(), session=session(None)
    )
    assert (d.action, d.phase) == ("finish", "Succeeded")


def test_a_passing_evaluation_succeeds() -> None:
    d = decide_after_settlement(
        state=state(1),
        settled=settled("completed"),
        agent=agent(),
        session=session(),
        evaluation=PASS,
    )
    assert (d.action, d.phase) == ("finish", "Succeeded")
    assert "passed" in d.message


def test_a_failing_evaluation_gives_another_turn_with_the_reason() -> None:
    d = decide_after_settlement(
        state=state(1),
        settled=settled("completed"),
        agent=agent(),
        session=session(3),
        evaluation=FAIL,
    )
    assert (d.action, d.phase) == ("continue", "Running")
    assert d.follow_up is not None
    assert "`make test` failed (exit 1)" in d.follow_up
    assert "1 failed, 2 passed" in d.follow_up
    assert "2 turn(s) left" in d.follow_up


def test_the_guard_stops_the_session_when_its_budget_is_spent() -> None:
    d = decide_after_settlement(
        state=state(3),
        settled=settled("completed"),
        agent=agent(),
        session=session(3),
        evaluation=FAIL,
    )
    assert (d.action, d.phase) == ("finish", "Failed")
    assert "turn budget of 3 is spent" in d.message


def test_the_agents_turn_limit_stops_before_the_guards_budget() -> None:
    d = decide_after_settlement(
        state=state(2),
        settled=settled("completed"),
        agent=agent(max_turns=2),
        session=session(5),
        evaluation=FAIL,
    )
    assert (d.action, d.phase) == ("finish", "Failed")
    assert "limit of 2 turns" in d.message


def test_turns_left_is_the_tighter_of_budget_and_limit() -> None:
    d = decide_after_settlement(
        state=state(1),
        settled=settled("completed"),
        agent=agent(max_turns=2),
        session=session(5),
        evaluation=FAIL,
    )
    assert d.follow_up is not None and "1 turn(s) left" in d.follow_up


def test_failed_settlement_fails_the_session_with_its_error() -> None:
    d = decide_after_settlement(
        state=state(1),
        settled=settled("failed", "provider_error"),
        agent=agent(),
        session=session(),
    )
    assert (d.action, d.phase) == ("finish", "Failed")
    assert "provider_error: boom" in d.message


def test_aborted_on_request_stops() -> None:
    d = decide_after_settlement(
        state=state(1),
        settled=settled("aborted", "submission_aborted"),
        agent=agent(),
        session=session(),
        abort_requested=True,
    )
    assert (d.action, d.phase) == ("finish", "Stopped")


def test_aborted_by_someone_else_fails() -> None:
    d = decide_after_settlement(
        state=state(1),
        settled=settled("aborted", "submission_aborted"),
        agent=agent(),
        session=session(),
    )
    assert (d.action, d.phase) == ("finish", "Failed")
    assert "submission_aborted" in d.message


def test_an_abort_request_wins_over_a_completed_turn_that_would_continue() -> None:
    d = decide_after_settlement(
        state=state(1),
        settled=settled("completed"),
        agent=agent(),
        session=session(),
        evaluation=FAIL,
        abort_requested=True,
    )
    assert (d.action, d.phase) == ("finish", "Stopped")


@pytest.mark.parametrize(
    ("pick", "phase"),
    [
        ("mcp__corral__wait_for_children", "WaitingForChildren"),
        ("mcp__corral__request_approval", "WaitingForHuman"),
        # land ends a turn only on asking for its Approval: the session waits for a person.
        ("mcp__corral__land", "WaitingForHuman"),
    ],
)
def test_a_pick_that_hands_over_waits(pick: str, phase: str) -> None:
    ended = settled("ended")
    assert not needs_evaluation(ended, pick)
    d = decide_after_settlement(
        state=state(1, 0), settled=ended, agent=agent(), session=session(), pick=pick
    )
    assert (d.action, d.phase) == ("finish", phase)


def test_an_ended_turn_by_another_pick_is_judged_like_a_completed_one() -> None:
    ended = settled("ended")
    assert needs_evaluation(ended, "finish_checklist")
    d = decide_after_settlement(
        state=state(1),
        settled=ended,
        agent=agent(),
        session=session(),
        evaluation=FAIL,
        pick="finish_checklist",
    )
    assert d.action == "continue"


def test_a_guard_without_an_evaluation_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="no evaluation"):
        decide_after_settlement(
            state=state(1), settled=settled("completed"), agent=agent(), session=session()
        )


def test_substring_criterion() -> None:
    assert evaluate_substring("DONE", "all DONE here").passed
    miss = evaluate_substring("DONE", "not yet")
    assert not miss.passed and "not found" in miss.summary


def test_exit_criterion() -> None:
    assert evaluate_exit("true", 0, "", False).passed
    failed = evaluate_exit("pytest", 1, "x" * 5000 + "tail", False)
    assert not failed.passed and failed.detail.endswith("tail") and len(failed.detail) == 1500
    timed_out = evaluate_exit("sleep 9", 0, "", True)
    assert not timed_out.passed and "timed out" in timed_out.summary
