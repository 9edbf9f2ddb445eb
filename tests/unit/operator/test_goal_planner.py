"""The Goal planner: waves of Sessions, the success check as Evidence, Met or Failed."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from corral_api.digest import check_definition_digest
from corral_api.labels import evidence_labels
from corral_operator.planning.goal import (
    GOAL_ANNOTATION,
    WAVE_ANNOTATION,
    GoalPlan,
    plan_goal,
    wave_session_name,
)

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
REPO = "https://git.example/shop.git"
REV1, REV2 = "1" * 40, "2" * 40
UID = "goal-uid-1"


def _goal(status: dict[str, Any] | None = None, max_waves: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Goal",
        "metadata": {"name": "green", "namespace": "team-a", "uid": UID, "generation": 1},
        "spec": {
            "description": "The price rounds correctly.",
            "success": {"name": "price", "command": "grep -q fixed price.txt"},
            "maxWaves": max_waves,
            "sessionTemplate": {
                "spec": {
                    "agentRef": "coder",
                    "task": "Fix the price rounding.",
                    "workspace": {"repo": REPO, "ref": "main"},
                }
            },
        },
        "status": status or {},
    }


def _session(name: str, phase: str, revision: str | None = None, **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "ownerReferences": [{"kind": "Goal", "name": "green", "uid": UID}],
        },
        "status": {"phase": phase, **status},
    }
    if revision is not None:
        body["status"]["delivery"] = {"state": "Delivered", "revision": revision}
    return body


def _evidence(revision: str, verdict: str | None, **status: Any) -> dict[str, Any]:
    command = "grep -q fixed price.txt"
    return {
        "metadata": {
            "name": f"price-{revision[:12]}-x",
            "namespace": "team-a",
            "labels": evidence_labels("price", revision, REPO),
        },
        "spec": {
            "repo": REPO,
            "revision": revision,
            "check": "price",
            "command": command,
            "definitionDigest": check_definition_digest(command, None),
        },
        "status": {"verdict": verdict, **status} if verdict else {},
    }


def _then(plan: GoalPlan) -> dict[str, Any]:
    """The Goal as the next pass reads it: the status the plan wrote."""
    return _goal(copy.deepcopy(plan.status))


def _cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_a_new_goal_starts_wave_one_from_its_template() -> None:
    plan = plan_goal(_goal(), [], [], NOW)
    (session,) = plan.create
    assert session["kind"] == "Session" and session["metadata"]["name"] == "green-wave-1"
    assert session["metadata"]["ownerReferences"][0]["uid"] == UID
    assert session["metadata"]["annotations"] == {GOAL_ANNOTATION: "green", WAVE_ANNOTATION: "1"}
    assert session["metadata"]["labels"]["corral.dev/goal"] == "green"
    spec = session["spec"]
    assert spec["task"].startswith("Fix the price rounding.")
    assert "wave 1 of at most 2" in spec["task"] and "grep -q fixed price.txt" in spec["task"]
    assert spec["workspace"] == {"repo": REPO, "ref": "main", "grantedRoot": "/workspace"}
    assert plan.status["waves"] == 1 and plan.status["session"] == "green-wave-1"
    assert plan.status["history"] == [{"wave": 1, "session": "green-wave-1", "verdict": "Pending"}]
    assert _cond(plan.status, "Progressing")["reason"] == "WaveRunning"
    assert [e.reason for e in plan.events] == ["WaveStarted"]


def test_a_running_wave_is_waited_for_and_a_second_pass_plans_nothing_new() -> None:
    first = plan_goal(_goal(), [], [], NOW)
    again = plan_goal(_then(first), [_session("green-wave-1", "Running")], [], NOW)
    assert again.create == [] and again.status["history"][0]["phase"] == "Running"
    assert again.status["waves"] == 1 and "is Running" in again.status["message"]
    assert plan_goal(_then(again), [_session("green-wave-1", "Running")], [], NOW).changed is False


def test_a_finished_wave_is_checked_as_evidence_at_the_revision_it_pushed() -> None:
    goal = _then(plan_goal(_goal(), [], [], NOW))
    plan = plan_goal(goal, [_session("green-wave-1", "Succeeded", REV1)], [], NOW)
    (evidence,) = plan.create
    assert evidence["kind"] == "Evidence"
    assert evidence["spec"]["revision"] == REV1 and evidence["spec"]["repo"] == REPO
    assert evidence["spec"]["command"] == "grep -q fixed price.txt"
    assert evidence["metadata"]["labels"]["corral.dev/revision"] == REV1
    assert evidence["metadata"]["annotations"][GOAL_ANNOTATION] == "green"
    assert "ownerReferences" not in evidence["metadata"]  # a verdict outlives the Goal
    wave = plan.status["history"][0]
    assert wave["revision"] == REV1 and wave["evidence"] == evidence["metadata"]["name"]
    assert _cond(plan.status, "Progressing")["reason"] == "CheckingWave"


def test_a_failed_check_starts_the_next_wave_with_what_was_learnt() -> None:
    goal = _then(plan_goal(_goal(), [], [], NOW))
    wave1 = _session("green-wave-1", "Succeeded", REV1, answer="I changed round() to floor().")
    failed = _evidence(REV1, "Fail", exitCode=1, logTail="price.txt: not fixed")
    plan = plan_goal(goal, [wave1], [failed], NOW)
    (session,) = plan.create
    assert session["metadata"]["name"] == "green-wave-2"
    task = session["spec"]["task"]
    assert "wave 2 of at most 2" in task
    assert "I changed round() to floor()." in task
    assert f"{REV1} was checked: Fail (exit code 1)" in task
    assert "price.txt: not fixed" in task
    assert session["spec"]["workspace"]["ref"] == REV1  # the work goes on from wave 1
    history = plan.status["history"]
    assert history[0]["verdict"] == "Fail" and history[0]["phase"] == "Succeeded"
    assert history[1] == {"wave": 2, "session": "green-wave-2", "verdict": "Pending"}
    assert plan.status["verdict"] == "Pending" and plan.status["waves"] == 2
    assert [e.reason for e in plan.events] == ["WaveFailed", "WaveStarted"]


def test_a_pass_in_wave_two_meets_the_goal() -> None:
    goal = _then(plan_goal(_goal(), [], [], NOW))
    wave1 = _session("green-wave-1", "Succeeded", REV1)
    goal = _then(plan_goal(goal, [wave1], [_evidence(REV1, "Fail", exitCode=1)], NOW))
    wave2 = _session("green-wave-2", "Succeeded", REV2)
    evidences = [_evidence(REV1, "Fail", exitCode=1), _evidence(REV2, "Pass", exitCode=0)]
    plan = plan_goal(goal, [wave1, wave2], evidences, NOW)
    assert plan.create == [] and plan.requeue_after is None
    assert plan.status["verdict"] == "Met" and plan.status["revision"] == REV2
    assert [w["verdict"] for w in plan.status["history"]] == ["Fail", "Pass"]
    assert _cond(plan.status, "Met")["status"] == "True"
    assert _cond(plan.status, "Progressing")["reason"] == "GoalMet"
    # Settled: later passes change nothing and start nothing.
    settled = plan_goal(_then(plan), [wave1, wave2], evidences, NOW + timedelta(hours=1))
    assert settled.create == [] and not settled.changed


def test_the_goal_fails_when_its_last_wave_fails() -> None:
    goal = _then(plan_goal(_goal(max_waves=1), [], [], NOW))
    goal["spec"]["maxWaves"] = 1
    plan = plan_goal(
        goal, [_session("green-wave-1", "Succeeded", REV1)], [_evidence(REV1, "Error")], NOW
    )
    assert plan.create == [] and plan.status["verdict"] == "Failed"
    assert _cond(plan.status, "Met")["reason"] == "WavesExhausted"
    assert "GoalFailed" in [e.reason for e in plan.events]


def test_a_wave_that_pushed_nothing_counts_as_a_failed_wave() -> None:
    goal = _then(plan_goal(_goal(), [], [], NOW))
    nothing = _session("green-wave-1", "Failed", message="turn 1 failed")
    nothing["status"]["delivery"] = {"state": "NothingToDeliver", "message": "no change"}
    plan = plan_goal(goal, [nothing], [], NOW)
    assert plan.status["history"][0]["verdict"] == "NoRevision"
    (session,) = plan.create
    assert "It pushed nothing to check" in session["spec"]["task"]
    assert session["spec"]["workspace"]["ref"] == "main"


def test_a_delivery_record_still_on_its_way_is_waited_for() -> None:
    goal = _then(plan_goal(_goal(), [], [], NOW))
    just_done = _session("green-wave-1", "Succeeded", finishedAt="2026-11-29T11:59:50Z")
    plan = plan_goal(goal, [just_done], [], NOW)
    assert plan.create == [] and plan.requeue_after == 20.0


def test_sessions_the_goal_does_not_own_are_ignored() -> None:
    goal = _then(plan_goal(_goal(), [], [], NOW))
    stranger = _session("green-wave-1", "Succeeded", REV1)
    stranger["metadata"]["ownerReferences"] = []
    plan = plan_goal(goal, [stranger], [], NOW)
    assert [m["kind"] for m in plan.create] == ["Session"]  # its own wave 1, created again


def test_an_invalid_spec_is_said_in_ready_and_nothing_starts() -> None:
    body = _goal()
    body["spec"]["success"]["name"] = "Not A Label"
    plan = plan_goal(body, [], [], NOW)
    assert plan.create == [] and plan.requeue_after is None
    ready = _cond(plan.status, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "success.name" in ready["message"]


def test_wave_session_names_stay_dns_labels() -> None:
    name = wave_session_name("g" * 80, 12)
    assert len(name) <= 63 and name.endswith("-wave-12")
    assert name != wave_session_name("g" * 79 + "h", 12)
