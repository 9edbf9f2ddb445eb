"""The Session planner: sandbox lifecycle, phases, conditions, TTL, and refusals with reasons."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from corral_operator.driver import DriverState
from corral_operator.planning.patch import merge_patch
from corral_operator.planning.session import SandboxState, plan_session, pod_is_ready
from corral_operator.planning.turns import status_with_driver_state
from corral_operator.settings import OperatorSettings
from tests._objects import agent_body, approval_decision, sandbox_pod, session_body

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
SETTINGS = OperatorSettings()


def _cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_new_session_creates_its_sandbox() -> None:
    plan = plan_session(session_body(), agent_body(), None, SETTINGS, NOW)
    assert plan.create_sandbox and not plan.drive
    assert plan.status["podName"] == "corral-fix-bug"
    assert plan.status["phase"] == "Pending"
    # The status as it stands once the pod is created (the apply writes it after creating).
    assert _cond(plan.status, "Ready")["reason"] == "SandboxStarting"
    assert _cond(plan.status, "Progressing")["reason"] == "CreatingSandbox"
    assert plan.status_changed
    assert [e.reason for e in plan.events] == ["SandboxCreating"]


def test_the_pass_that_sees_the_pod_starting_writes_nothing_new() -> None:
    created = plan_session(session_body(), agent_body(), None, SETTINGS, NOW)
    body = session_body()
    body["status"] = created.status
    seen = plan_session(body, agent_body(), sandbox_pod(False), SETTINGS, NOW)
    assert not seen.status_changed and not seen.events


def test_ready_pod_lets_the_driver_run_at_the_pod_ip() -> None:
    plan = plan_session(session_body(), agent_body(), sandbox_pod(True), SETTINGS, NOW)
    assert plan.harness_url == "http://127.0.3.4:8080"
    assert _cond(plan.status, "Ready")["status"] == "True"
    assert not plan.create_sandbox


def test_pod_without_ip_or_ready_waits() -> None:
    plan = plan_session(session_body(), agent_body(), sandbox_pod(False), SETTINGS, NOW)
    assert not plan.drive and not plan.create_sandbox
    assert _cond(plan.status, "Ready")["reason"] == "SandboxStarting"
    assert pod_is_ready(sandbox_pod(True)) and not pod_is_ready(sandbox_pod(True, deleting=True))


def test_status_unchanged_means_no_patch_and_stable_transition_times() -> None:
    first = plan_session(session_body(), agent_body(), sandbox_pod(True), SETTINGS, NOW)
    again = plan_session(
        session_body(status=first.status),
        agent_body(),
        sandbox_pod(True),
        SETTINGS,
        NOW + timedelta(minutes=5),
    )
    assert not again.status_changed
    assert again.status == first.status


def test_transition_time_moves_only_when_the_status_flips() -> None:
    starting = plan_session(session_body(), agent_body(), sandbox_pod(False), SETTINGS, NOW)
    later = NOW + timedelta(seconds=30)
    still = plan_session(
        session_body(status=starting.status), agent_body(), sandbox_pod(False), SETTINGS, later
    )
    assert _cond(still.status, "Ready")["lastTransitionTime"] == "2026-11-29T12:00:00Z"
    ready = plan_session(
        session_body(status=still.status), agent_body(), sandbox_pod(True), SETTINGS, later
    )
    assert _cond(ready.status, "Ready")["lastTransitionTime"] == "2026-11-29T12:00:30Z"
    # Progressing stayed True throughout: its time did not move.
    assert _cond(ready.status, "Progressing")["lastTransitionTime"] == "2026-11-29T12:00:00Z"


def test_missing_agent_holds_the_session_with_a_reason() -> None:
    plan = plan_session(session_body(), None, None, SETTINGS, NOW)
    assert not plan.create_sandbox
    assert plan.status["phase"] == "Pending"
    assert "not found" in plan.status["message"]
    assert _cond(plan.status, "Progressing")["reason"] == "AgentNotFound"
    assert plan.requeue_after is not None


def test_invalid_agent_holds_the_session_and_says_why() -> None:
    plan = plan_session(session_body(), agent_body(ready=False), None, SETTINGS, NOW)
    assert not plan.create_sandbox
    assert "tools.deny has '*'" in plan.status["message"]
    assert _cond(plan.status, "Progressing")["reason"] == "AgentNotReady"


def test_agent_ready_for_an_older_generation_is_not_ready() -> None:
    stale = agent_body()
    stale["metadata"]["generation"] = 2
    plan = plan_session(session_body(), stale, None, SETTINGS, NOW)
    assert not plan.create_sandbox


def test_a_spec_the_sandbox_cannot_run_fails_with_invalid_spec() -> None:
    body = session_body(workspace={"repo": "https://x/r.git", "ref": "-evil"})
    plan = plan_session(body, agent_body(), None, SETTINGS, NOW)
    assert plan.status["phase"] == "Failed"
    assert "must not start with '-'" in plan.status["message"]
    assert _cond(plan.status, "Failed")["reason"] == "InvalidSpec"
    assert _cond(plan.status, "Succeeded")["status"] == "False"
    assert plan.status["finishedAt"] == "2026-11-29T12:00:00Z"
    assert not plan.create_sandbox
    assert plan.events[-1].type == "Warning" and plan.events[-1].reason == "PhaseFailed"


def test_a_relative_repo_without_a_local_root_fails_and_says_why() -> None:
    body = session_body(workspace={"repo": "demo/repo"})
    plan = plan_session(body, agent_body(), None, SETTINGS, NOW)
    assert plan.status["phase"] == "Failed"
    assert "'demo/repo' is a relative path" in plan.status["message"]
    assert "--local-repo-root" in plan.status["message"]
    assert _cond(plan.status, "Failed")["reason"] == "InvalidSpec"
    assert not plan.create_sandbox


def test_a_relative_repo_under_a_local_root_creates_the_sandbox() -> None:
    body = session_body(workspace={"repo": "demo/repo"})
    settings = OperatorSettings(local_repo_root="/srv/corral/repos")
    plan = plan_session(body, agent_body(), None, settings, NOW)
    assert plan.create_sandbox
    assert plan.status.get("phase") != "Failed"


def test_unparseable_session_fails_with_the_field_named() -> None:
    body = session_body()
    body["spec"]["task"] = ""
    plan = plan_session(body, agent_body(), None, SETTINGS, NOW)
    assert plan.status["phase"] == "Failed"
    assert "task" in plan.status["message"]


def test_lost_pod_after_turns_fails_the_session() -> None:
    status = {"phase": "Running", "podName": "corral-fix-bug", "turns": 1}
    plan = plan_session(session_body(status=status), agent_body(), None, SETTINGS, NOW)
    assert plan.status["phase"] == "Failed"
    assert _cond(plan.status, "Failed")["reason"] == "SandboxLost"
    assert not plan.create_sandbox


ARCHIVING = OperatorSettings(archive_dir="/var/lib/corral/archive")


def test_with_an_archive_a_lost_pod_resumes_the_session_in_a_new_pod() -> None:
    ledger = {"streamUrl": "/s", "offset": 7, "submissionId": "sub_1", "turn": 2}
    status = {"phase": "Running", "podName": "corral-fix-bug", "turns": 1, "ledger": ledger}
    plan = plan_session(session_body(status=status), agent_body(), None, ARCHIVING, NOW)
    assert plan.status["phase"] == "Running" and plan.status["restarts"] == 1
    assert plan.status["ledger"]["submissionId"] == "sub_1"  # the turn is resumed, not dropped
    assert "podName" not in plan.status  # the next pass makes the new pod
    resumed = _cond(plan.status, "Resumed")
    assert resumed["status"] == "True" and resumed["reason"] == "PodDeleted"
    assert "restart 1 of at most 3" in resumed["message"]
    assert _cond(plan.status, "Progressing")["reason"] == "Resuming"
    assert [e.reason for e in plan.events][:1] == ["Resumed"]
    # The next pass, the old pod gone: a new sandbox.
    after = merge_patch(status, plan.status)
    again = plan_session(session_body(status=after), agent_body(), None, ARCHIVING, NOW)
    assert again.create_sandbox and again.status["restarts"] == 1


def test_a_lost_pod_past_max_restarts_or_an_evicted_one_says_so() -> None:
    status = {"phase": "Running", "podName": "corral-fix-bug", "turns": 1, "restarts": 1}
    agent = agent_body(limits={"maxRestarts": 1})
    plan = plan_session(session_body(status=status), agent, None, ARCHIVING, NOW)
    assert plan.status["phase"] == "Failed"
    assert _cond(plan.status, "Failed")["reason"] == "SandboxLost"
    assert "after 1 restarts, its Agent's spec.limits.maxRestarts" in plan.status["message"]
    never = plan_session(
        session_body(status={**status, "restarts": 0}),
        agent_body(limits={"maxRestarts": 0}), None, ARCHIVING, NOW,
    )  # fmt: skip
    assert never.status["phase"] == "Failed"
    evicted = sandbox_pod(True, deleting=True)
    evicted["status"].update(reason="Evicted", message="The node was low on memory.")
    plan = plan_session(session_body(status=status), agent_body(), evicted, ARCHIVING, NOW)
    assert _cond(plan.status, "Resumed")["reason"] == "PodEvicted"
    assert "low on memory" in plan.status["message"]


def test_a_pod_its_kubelet_evicted_resumes_and_is_deleted_to_make_way() -> None:
    """Node-pressure eviction leaves the pod Failed, not deleted: it serves nothing, so the
    Session resumes, and the dead pod (which holds the new pod's name) is deleted first,
    without archiving from it; then the new pod is made."""
    ledger = {"streamUrl": "/s", "offset": 7, "submissionId": "sub_1", "turn": 2}
    status = {"phase": "Running", "podName": "corral-fix-bug", "turns": 1, "ledger": ledger}
    evicted = sandbox_pod(True)
    evicted["status"].update(phase="Failed", reason="Evicted", message="low on memory")
    plan = plan_session(session_body(status=status), agent_body(), evicted, ARCHIVING, NOW)
    assert not plan.drive and plan.status["restarts"] == 1
    assert _cond(plan.status, "Resumed")["reason"] == "PodEvicted"
    after = merge_patch(status, plan.status)
    again = plan_session(session_body(status=after), agent_body(), evicted, ARCHIVING, NOW)
    assert again.discard_pod and not again.delete_pod and not again.create_sandbox
    assert again.status["restarts"] == 1  # the same loss, not a second one
    gone = plan_session(session_body(status=after), agent_body(), None, ARCHIVING, NOW)
    assert gone.create_sandbox and not gone.discard_pod
    # A pod being deleted is waited out, never deleted again.
    deleting = sandbox_pod(True, deleting=True)
    waiting = plan_session(session_body(status=after), agent_body(), deleting, ARCHIVING, NOW)
    assert not waiting.discard_pod and not waiting.create_sandbox


def test_terminating_pod_of_an_earlier_life_is_waited_out() -> None:
    plan = plan_session(
        session_body(), agent_body(), sandbox_pod(True, deleting=True), SETTINGS, NOW
    )
    assert not plan.create_sandbox and not plan.drive
    assert plan.requeue_after == 1.0


def test_a_pod_of_an_earlier_session_with_the_same_name_is_not_ours() -> None:
    stale = sandbox_pod(True, owner="uid-of-a-deleted-session")
    plan = plan_session(session_body(), agent_body(), stale, SETTINGS, NOW)
    assert not plan.drive and not plan.create_sandbox
    assert _cond(plan.status, "Progressing")["reason"] == "SandboxConflict"
    assert plan.requeue_after == 1.0


def _finished(phase: str, **extra: Any) -> dict[str, Any]:
    return {
        "phase": phase,
        "podName": "corral-fix-bug",
        "turns": 2,
        "message": "done",
        "finishedAt": "2026-11-29T11:59:00Z",
        **extra,
    }


def test_finished_session_releases_its_pod() -> None:
    plan = plan_session(
        session_body(status=_finished("Succeeded")), agent_body(), sandbox_pod(True), SETTINGS, NOW
    )
    assert plan.delete_pod and not plan.drive and not plan.delete_session
    assert _cond(plan.status, "Succeeded")["status"] == "True"
    assert _cond(plan.status, "Progressing")["status"] == "False"
    assert _cond(plan.status, "Ready")["reason"] == "SandboxReleased"


def test_keep_sandbox_keeps_the_pod() -> None:
    body = session_body(status=_finished("Succeeded"), keepSandbox=True)
    plan = plan_session(body, agent_body(), sandbox_pod(True), SETTINGS, NOW)
    assert not plan.delete_pod
    assert _cond(plan.status, "Ready")["reason"] == "SandboxKept"


@pytest.mark.parametrize(
    ("ttl", "seconds_since_finish", "deleted"),
    [(30, 20, False), (30, 30, True), (0, 0, True), (60, 90, True)],
)
def test_ttl_after_finished(ttl: int, seconds_since_finish: int, deleted: bool) -> None:
    body = session_body(status=_finished("Failed"), ttlSecondsAfterFinished=ttl)
    finished = datetime(2026, 11, 29, 11, 59, 0, tzinfo=UTC)
    plan = plan_session(
        body, agent_body(), None, SETTINGS, finished + timedelta(seconds=seconds_since_finish)
    )
    assert plan.delete_session is deleted
    if not deleted:
        assert plan.requeue_after == pytest.approx(ttl - seconds_since_finish)


def test_no_ttl_keeps_the_finished_session() -> None:
    plan = plan_session(session_body(status=_finished("Failed")), agent_body(), None, SETTINGS, NOW)
    assert not plan.delete_session and plan.requeue_after is None


def test_ttl_requeues_until_due() -> None:
    body = session_body(status=_finished("Succeeded"), ttlSecondsAfterFinished=120)
    plan = plan_session(body, agent_body(), None, SETTINGS, NOW)
    assert not plan.delete_session
    assert plan.requeue_after == pytest.approx(60.0)


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"lastSettlement": {"submissionId": "s", "status": "failed", "turn": 2}}, "TurnFailed"),
        ({"lastSettlement": {"submissionId": "s", "status": "aborted", "turn": 2}}, "TurnAborted"),
        ({"evaluationTurns": 3}, "EvaluationFailed"),
    ],
)
def test_failure_reasons_come_from_the_last_settlement(extra: dict[str, Any], reason: str) -> None:
    plan = plan_session(
        session_body(status=_finished("Failed", **extra)), agent_body(), None, SETTINGS, NOW
    )
    assert _cond(plan.status, "Failed")["reason"] == reason


def test_in_flight_turn_is_named_in_progressing() -> None:
    status = {
        "phase": "Running",
        "podName": "corral-fix-bug",
        "ledger": {"streamUrl": "/u", "offset": 0, "submissionId": "sub-1", "turn": 2},
    }
    plan = plan_session(session_body(status=status), agent_body(), sandbox_pod(True), SETTINGS, NOW)
    assert _cond(plan.status, "Progressing")["reason"] == "Turn2InFlight"
    assert plan.drive


def _child(phase: str) -> dict[str, Any]:
    return {"metadata": {"name": f"c-{phase}"}, "status": {"phase": phase}}


def test_children_are_summarised_in_status() -> None:
    children = [_child("Running"), _child("Succeeded"), _child("Failed"), {"metadata": {}}]
    plan = plan_session(session_body(), agent_body(), sandbox_pod(True), SETTINGS, NOW, children)
    assert plan.status["children"] == {"total": 4, "running": 2, "succeeded": 1, "failed": 1}


def test_waiting_for_children_resumes_only_when_none_runs() -> None:
    waiting = {"phase": "WaitingForChildren", "podName": "corral-fix-bug", "turns": 1}
    busy = plan_session(
        session_body(status=waiting),
        agent_body(),
        sandbox_pod(True),
        SETTINGS,
        NOW,
        [_child("Running")],
    )
    assert not busy.drive and busy.requeue_after == 5.0
    done = plan_session(
        session_body(status=waiting),
        agent_body(),
        sandbox_pod(True),
        SETTINGS,
        NOW,
        [_child("Succeeded")],
    )
    assert done.drive


def test_waiting_for_a_human_resumes_once_its_approvals_are_decided() -> None:
    waiting = {"phase": "WaitingForHuman", "podName": "corral-fix-bug", "turns": 1}
    pending = [approval_decision(None), approval_decision("Approved", "someone-else")]
    held = plan_session(
        session_body(status=waiting), agent_body(), sandbox_pod(True), SETTINGS, NOW, [], pending
    )
    assert not held.drive
    # Another session's decision does not release this one; its own does.
    decided = [approval_decision("Denied"), approval_decision(None, "someone-else")]
    go = plan_session(
        session_body(status=waiting), agent_body(), sandbox_pod(True), SETTINGS, NOW, [], decided
    )
    assert go.drive


def test_the_end_written_as_released_leaves_the_release_pass_nothing_to_write() -> None:
    """The driver's last save says the sandbox is released when the next pass will delete the
    pod at once: that pass deletes it and writes nothing (one status write fewer a Session)."""
    running = plan_session(
        session_body(status={"phase": "Running", "podName": "corral-fix-bug"}),
        agent_body(),
        sandbox_pod(True),
        SETTINGS,
        NOW,
    ).status
    ended = DriverState(
        phase="Succeeded", turns=1, message="done", finished_at="2026-11-29T11:59:00Z"
    )
    stamp = "2026-11-29T12:00:00Z"
    cases: tuple[tuple[SandboxState, bool], ...] = (("released", False), ("kept", True))
    for at_end, pass_writes in cases:
        last = status_with_driver_state(
            running, ended, "ready", now=stamp, generation=1, at_end=at_end
        )
        plan = plan_session(
            session_body(status=last), agent_body(), sandbox_pod(True), SETTINGS, NOW
        )
        assert plan.delete_pod
        assert _cond(plan.status, "Ready")["reason"] == "SandboxReleased"
        assert bool(merge_patch(last, plan.status)) is pass_writes, at_end
