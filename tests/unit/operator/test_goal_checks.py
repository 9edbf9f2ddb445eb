"""The Goal planner's checks, each alone, and the order of their chain: every check decides on
the input it is about (the decision and its reason) and passes (None) on one it is not."""

from __future__ import annotations

from typing import Any

import pytest

from corral_operator.planning import _goal_checks as checks
from corral_operator.planning._goal_checks import (
    GOAL_CHECKS,
    GoalCheck,
    GoalDecision,
    GoalInputs,
    decide_goal,
)
from corral_operator.planning.goal import plan_goal

from .test_goal_planner import NOW, REV1, _evidence, _goal, _session

FAILING = _evidence(REV1, "Fail", exitCode=1, logTail="expected fixed")


def _wave(phase: str | None = None, **wave: Any) -> dict[str, Any]:
    """A Goal whose wave 1 started (as its first pass wrote it); `wave` updates that wave."""
    status = plan_goal(_goal(), [], [], NOW).status
    status["history"][0].update(wave)
    if phase is not None:
        status["history"][0]["phase"] = phase
    return status


def _inputs(
    status: dict[str, Any] | None = None,
    sessions: list[dict[str, Any]] | None = None,
    evidences: list[dict[str, Any]] | None = None,
    max_waves: int = 2,
) -> GoalInputs:
    return GoalInputs(_goal(status, max_waves=max_waves), sessions or [], evidences or [], NOW)


def _ended(phase: str = "Succeeded", revision: str | None = REV1, **status: Any) -> dict[str, Any]:
    return _session("green-wave-1", phase, revision, **status)


def _decided(check: GoalCheck, inputs: GoalInputs) -> GoalDecision:
    decision = check(inputs)
    assert decision is not None, f"{check.__name__} did not decide"
    return decision


def _condition(decision: GoalDecision, type_: str) -> tuple[str, str]:
    found = next(c for c in decision.status.conditions if c.type == type_)
    return found.status, found.reason


def _invalid() -> GoalInputs:
    body = _goal()
    body["spec"]["success"]["name"] = "Not A Label"
    return GoalInputs(body, [], [], NOW)


# ---------------------------------------------------------------- each check deciding


def test_spec_invalid_says_so_in_ready_and_settles() -> None:
    decision = _decided(checks.spec_invalid, _invalid())
    assert decision.reason == checks.INVALID_SPEC and decision.requeue_after is None
    assert _condition(decision, "Ready") == ("False", checks.INVALID_SPEC)
    assert decision.create == () and decision.events == ()


def test_settled_keeps_the_history_as_it_was() -> None:
    status = {**_wave("Succeeded"), "verdict": "Met"}
    decision = _decided(checks.settled, _inputs(status, [_ended()]))
    assert decision.reason is None and decision.requeue_after is None
    assert decision.status.history[0].phase == "Succeeded" and decision.create == ()
    assert _condition(decision, "Ready") == ("True", checks.ACCEPTED)


def test_first_wave_starts_wave_one() -> None:
    decision = _decided(checks.first_wave, _inputs())
    assert decision.reason == checks.WAVE_RUNNING
    (session,) = decision.create
    assert session["kind"] == "Session" and session["metadata"]["name"] == "green-wave-1"
    assert decision.status.waves == 1 and decision.status.session == "green-wave-1"
    assert [e.reason for e in decision.events] == ["WaveStarted"]


def test_wave_session_missing_creates_it_again_and_changes_nothing_else() -> None:
    inputs = _inputs(_wave())
    decision = _decided(checks.wave_session_missing, inputs)
    assert decision.reason is None and decision.events == ()
    (session,) = decision.create
    assert session["metadata"]["name"] == "green-wave-1"
    assert decision.status == inputs.accepted


def test_wave_session_missing_ignores_a_session_the_goal_does_not_own() -> None:
    stranger = _ended()
    stranger["metadata"]["ownerReferences"] = [{"kind": "Goal", "uid": "another-goal"}]
    assert checks.wave_session_missing(_inputs(_wave(), [stranger])) is not None


def test_wave_running_waits_for_the_session() -> None:
    decision = _decided(
        checks.wave_running, _inputs(_wave(), [_session("green-wave-1", "Running")])
    )
    assert decision.reason == checks.WAVE_RUNNING and decision.create == ()
    assert decision.status.message == "wave 1 of 2: Session green-wave-1 is Running"
    assert decision.status.history[0].phase == "Running"
    assert _condition(decision, "Progressing") == ("True", checks.WAVE_RUNNING)


def test_delivery_on_its_way_waits_out_the_grace() -> None:
    session = _ended(revision=None, finishedAt="2026-11-29T11:59:50Z")
    decision = _decided(checks.delivery_on_its_way, _inputs(_wave(), [session]))
    assert decision.reason == checks.WAVE_RUNNING and decision.requeue_after == 20.0
    assert decision.status.message == "wave 1: waiting for Session green-wave-1's delivery"
    assert decision.create == ()


def test_check_not_started_creates_the_evidence() -> None:
    decision = _decided(checks.check_not_started, _inputs(_wave(), [_ended()]))
    assert decision.reason == checks.CHECKING_WAVE
    (evidence,) = decision.create
    assert evidence["kind"] == "Evidence" and evidence["spec"]["revision"] == REV1
    annotations = evidence["metadata"]["annotations"]
    assert annotations["corral.dev/goal"] == "green" and annotations["corral.dev/goal-wave"] == "1"
    wave = decision.status.history[0]
    assert (wave.evidence, wave.verdict, wave.revision) == (
        evidence["metadata"]["name"],
        "Pending",
        REV1,
    )
    assert decision.status.revision == REV1
    assert [e.reason for e in decision.events] == ["WaveChecking"]


def test_check_running_waits_for_the_verdict() -> None:
    running = _evidence(REV1, None)
    decision = _decided(checks.check_running, _inputs(_wave(), [_ended()], [running]))
    assert decision.reason == checks.CHECKING_WAVE and decision.create == ()
    assert decision.status.history[0].evidence == running["metadata"]["name"]
    assert decision.events == ()


def test_goal_met_when_the_check_passes() -> None:
    decision = _decided(
        checks.goal_met, _inputs(_wave(), [_ended()], [_evidence(REV1, "Pass", exitCode=0)])
    )
    assert decision.reason == checks.GOAL_MET and decision.requeue_after is None
    assert decision.status.verdict == "Met" and decision.status.history[0].verdict == "Pass"
    assert _condition(decision, "Met") == ("True", checks.GOAL_MET)
    assert [e.reason for e in decision.events] == ["GoalMet"]


def test_waves_exhausted_fails_the_goal_after_its_last_wave() -> None:
    inputs = _inputs(_wave(), [_ended()], [FAILING], max_waves=1)
    decision = _decided(checks.waves_exhausted, inputs)
    assert decision.reason == checks.WAVES_EXHAUSTED and decision.requeue_after is None
    assert decision.status.verdict == "Failed"
    assert (decision.status.message or "").startswith("not met after 1 wave(s) (maxWaves 1)")
    assert _condition(decision, "Met") == ("False", checks.WAVES_EXHAUSTED)
    assert [e.reason for e in decision.events] == ["WaveFailed", "GoalFailed"]


def test_waves_exhausted_counts_a_wave_that_pushed_nothing() -> None:
    session = _ended("Failed", revision=None)
    decision = _decided(checks.waves_exhausted, _inputs(_wave(), [session], max_waves=1))
    assert decision.status.history[0].verdict == "NoRevision"
    assert "pushed nothing: no delivery recorded" in (decision.status.message or "")


def test_the_steady_state_starts_the_next_wave_from_what_this_one_pushed() -> None:
    decision = checks.steady_state(_inputs(_wave(), [_ended(answer="tried")], [FAILING]))
    assert decision.reason == checks.WAVE_RUNNING
    (session,) = decision.create
    assert session["metadata"]["name"] == "green-wave-2"
    assert session["spec"]["workspace"]["ref"] == REV1
    assert "expected fixed" in session["spec"]["task"] and "tried" in session["spec"]["task"]
    first, second = decision.status.history
    assert first.verdict == "Fail" and second.session == "green-wave-2"
    assert [e.reason for e in decision.events] == ["WaveFailed", "WaveStarted"]


# ---------------------------------------------------------------- each check passing

PASSES: list[tuple[GoalCheck, GoalInputs]] = [
    (checks.spec_invalid, _inputs()),
    (checks.settled, _inputs(_wave())),
    (checks.first_wave, _inputs(_wave())),
    (checks.wave_session_missing, _inputs(_wave(), [_session("green-wave-1", "Running")])),
    (checks.wave_running, _inputs(_wave(), [_ended()])),
    (checks.delivery_on_its_way, _inputs(_wave(), [_ended()])),
    (checks.delivery_on_its_way, _inputs(_wave(), [_ended("Failed", revision=None)])),
    (
        checks.delivery_on_its_way,
        _inputs(_wave(), [_ended(revision=None, finishedAt="2026-11-29T11:00:00Z")]),
    ),
    (checks.check_not_started, _inputs(_wave(), [_ended(revision=None)])),
    (checks.check_not_started, _inputs(_wave(), [_ended()], [FAILING])),
    (checks.check_running, _inputs(_wave(), [_ended()], [FAILING])),
    (checks.goal_met, _inputs(_wave(), [_ended()], [FAILING])),
    (checks.goal_met, _inputs(_wave(), [_ended(revision=None)])),
    (checks.waves_exhausted, _inputs(_wave(), [_ended()], [FAILING], max_waves=2)),
]


@pytest.mark.parametrize(
    ("check", "inputs"), PASSES, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(PASSES)]
)
def test_a_check_passes_what_it_does_not_decide(check: GoalCheck, inputs: GoalInputs) -> None:
    assert check(inputs) is None


def test_every_check_has_a_case_it_passes() -> None:
    assert {c for c, _ in PASSES} == set(GOAL_CHECKS)


# ---------------------------------------------------------------- the order of the chain


def test_the_chain_is_in_the_documented_order() -> None:
    assert [c.__name__ for c in GOAL_CHECKS] == [
        "spec_invalid",
        "settled",
        "first_wave",
        "wave_session_missing",
        "wave_running",
        "delivery_on_its_way",
        "check_not_started",
        "check_running",
        "goal_met",
        "waves_exhausted",
    ]


def test_an_invalid_spec_is_said_before_a_settled_verdict() -> None:
    body = _invalid().body
    inputs = GoalInputs({**body, "status": {**_wave(), "verdict": "Met"}}, [], [], NOW)
    assert checks.settled(inputs) is not None
    assert decide_goal(inputs).reason == checks.INVALID_SPEC


def test_a_settled_goal_starts_no_wave() -> None:
    inputs = _inputs({"verdict": "Failed"})
    assert checks.first_wave(inputs) is not None
    decision = decide_goal(inputs)
    assert decision.create == () and decision.requeue_after is None


def test_a_pass_in_the_last_wave_meets_the_goal() -> None:
    inputs = _inputs(_wave(), [_ended()], [_evidence(REV1, "Pass")], max_waves=1)
    assert checks.waves_exhausted(inputs) is not None
    assert decide_goal(inputs).reason == checks.GOAL_MET


def test_a_running_last_wave_is_waited_for() -> None:
    inputs = _inputs(_wave(), [_session("green-wave-1", "Running")], max_waves=1)
    assert checks.waves_exhausted(inputs) is not None
    assert decide_goal(inputs).reason == checks.WAVE_RUNNING
    assert decide_goal(inputs).requeue_after == checks.GOAL_RECHECK


def test_a_wave_no_check_decides_for_is_followed_by_the_next() -> None:
    inputs = _inputs(_wave(), [_ended()], [FAILING])
    assert all(check(inputs) is None for check in GOAL_CHECKS)
    assert decide_goal(inputs) == checks.steady_state(inputs)
