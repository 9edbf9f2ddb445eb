"""Agent validation, the driver-state-to-status mapping, merge patches, Evidence, Approval.

The Goal planner has its own file: test_goal_planner.py."""

from __future__ import annotations

from typing import Any

import pytest

from corral_api.kinds import AdmissionLedger, SettlementRecord, Usage
from corral_operator.builders.evidencepod import build_evidence_pod
from corral_operator.driver import DriverState
from corral_operator.planning.agent import (
    agent_ready,
    plan_agent,
    usable_spec,
    validate_agent_spec,
)
from corral_operator.planning.approval import check_approval
from corral_operator.planning.evidence import plan_evidence
from corral_operator.planning.patch import merge_patch
from corral_operator.planning.turns import event_for, status_with_driver_state
from corral_operator.settings import OperatorSettings

NOW = "2026-11-29T12:00:00Z"
LATER = "2026-11-29T12:05:00Z"


def _agent_body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "coder", "namespace": "a", "uid": "u", "generation": 3},
        "spec": {"identity": "x", "model": "m", **spec},
    }


# ------------------------------------------------------------------------------------ Agent


def test_valid_agent_is_ready_for_its_generation() -> None:
    plan = plan_agent(_agent_body(), NOW)
    assert plan.ready and plan.changed
    (cond,) = plan.status["conditions"]
    assert (cond["type"], cond["status"], cond["observedGeneration"]) == ("Ready", "True", 3)
    body = {**_agent_body(), "status": plan.status}
    assert agent_ready(body)
    assert not plan_agent(body, LATER).changed


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"tools": {"allow": ["bash"], "deny": ["*"]}}, "refuses every tool"),
        ({"tools": {"allow": ["bash"], "deny": ["bash"]}}, "in both tools.allow and tools.deny"),
        ({"limits": {"maxDepth": 2}}, "only applies to orchestrators"),
        ({"sandbox": {"egress": [{"cidr": "not-a-cidr"}]}}, "is not a CIDR"),
        ({"thinkingLevel": "extreme"}, "spec.thinkingLevel"),
        ({"model": ""}, "spec.model"),
    ],
)
def test_invalid_agent_is_not_ready_and_says_why(spec: dict[str, Any], problem: str) -> None:
    plan = plan_agent(_agent_body(**spec), NOW)
    assert not plan.ready
    assert plan.reason == "InvalidSpec"
    assert problem in plan.message
    assert not agent_ready({**_agent_body(**spec), "status": plan.status})


def test_a_changed_agent_is_usable_before_its_handler_judges_it_unless_it_is_invalid() -> None:
    judged = {**_agent_body(), "status": plan_agent(_agent_body(), NOW).status}
    assert usable_spec(judged) is not None
    # A newer generation the Agent's handler has not judged yet: the same check decides.
    changed = {**judged, "metadata": {**judged["metadata"], "generation": 4}}
    changed["spec"] = {**judged["spec"], "instructions": "PELICAN"}
    spec = usable_spec(changed)
    assert spec is not None and spec.instructions == "PELICAN"
    broken = {**changed, "spec": {**changed["spec"], "limits": {"maxDepth": 2}}}
    assert usable_spec(broken) is None
    # A verdict on this generation that says invalid wins, and no Agent is no spec.
    refused = {**_agent_body(), "status": plan_agent(_agent_body(model=""), NOW).status}
    assert usable_spec(refused) is None
    assert usable_spec(None) is None


def test_orchestrator_may_lower_max_depth() -> None:
    spec, problems = validate_agent_spec(
        {"identity": "x", "model": "m", "orchestrator": True, "limits": {"maxDepth": 2}}
    )
    assert spec is not None and problems == []


def test_fixing_an_agent_flips_ready_and_moves_the_transition_time() -> None:
    bad = plan_agent(_agent_body(tools={"allow": ["a"], "deny": ["a"]}), NOW)
    fixed = plan_agent({**_agent_body(), "status": bad.status}, LATER)
    (cond,) = fixed.status["conditions"]
    assert cond["status"] == "True" and cond["lastTransitionTime"] == LATER


# ------------------------------------------------------------------------------- turns


def test_driver_state_becomes_status_with_conditions() -> None:
    state = DriverState(
        phase="Running",
        turns=1,
        ledger=AdmissionLedger(stream_url="/u", offset=4, submission_id="s2", turn=2),
        usage=Usage(input_tokens=10, output_tokens=5, cost=0.01),
    )
    status = status_with_driver_state({"podName": "p"}, state, "ready", now=NOW, generation=1)
    assert status["podName"] == "p"  # planner fields survive
    assert status["ledger"] == {"streamUrl": "/u", "offset": 4, "submissionId": "s2", "turn": 2}
    # The harness's own figures never reach the status: usage is the custodian's record.
    assert status["usage"]["inputTokens"] == 0
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "Turn2InFlight"


def test_settled_state_drops_the_ledger_through_the_merge_patch() -> None:
    before = status_with_driver_state(
        {},
        DriverState(
            phase="Running",
            ledger=AdmissionLedger(stream_url="/u", offset=0, submission_id="s1", turn=1),
        ),
        "ready",
        now=NOW,
        generation=1,
    )
    after = status_with_driver_state(
        before,
        DriverState(
            phase="Succeeded",
            turns=1,
            last_settlement=SettlementRecord(submission_id="s1", status="completed", turn=1),
            finished_at=LATER,
        ),
        "ready",
        now=LATER,
        generation=1,
    )
    patch = merge_patch(before, after)
    assert patch["ledger"] is None
    assert patch["phase"] == "Succeeded"
    succeeded = next(c for c in after["conditions"] if c["type"] == "Succeeded")
    assert succeeded["status"] == "True" and succeeded["reason"] == "Completed"


def test_merge_patch_is_minimal_and_round_trips() -> None:
    old = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1]}
    new = {"a": 1, "b": {"c": 2, "d": 4}, "e": [1, 2], "f": None}
    patch = merge_patch(old, new)
    assert patch == {"b": {"d": 4}, "e": [1, 2], "f": None}
    assert merge_patch(old, old) == {}
    assert merge_patch({"x": 1}, {}) == {"x": None}


def test_driver_events_become_kubernetes_events() -> None:
    admitted = event_for({"source": "driver", "type": "admitted", "turn": 1, "submissionId": "s"})
    assert admitted is not None and admitted.reason == "TurnAdmitted"
    failed = event_for(
        {"source": "driver", "type": "settled", "turn": 2, "status": "failed", "error": "boom"}
    )
    assert failed is not None and failed.type == "Warning" and "boom" in failed.message
    evaluated = event_for(
        {
            "source": "driver",
            "type": "settled",
            "turn": 2,
            "status": "completed",
            "evaluation": {"passed": False, "summary": "substring 'ok' not found"},
        }
    )
    assert evaluated is not None and evaluated.reason == "EvaluationFailed"
    # The end is the PhaseSucceeded / PhaseFailed Event of the store's write, not a second one.
    assert event_for({"source": "driver", "type": "finished", "phase": "Succeeded"}) is None
    assert event_for({"type": "tool_start", "submissionId": "s", "offset": 1}) is None


# ----------------------------------------------------------------------------- Evidence

SHA = "a" * 40


def _evidence(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "unit", "namespace": "a", "uid": "ev-uid", "generation": 1},
        "spec": {"repo": "https://x/r.git", "revision": SHA, "check": "unit", "command": "make"},
        "status": status or {},
    }


def _check_pod(exit_code: int | None, init_exit: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if init_exit is not None:
        status["initContainerStatuses"] = [
            {"name": "checkout", "state": {"terminated": {"exitCode": init_exit}}}
        ]
    if exit_code is not None:
        status["containerStatuses"] = [
            {"name": "check", "state": {"terminated": {"exitCode": exit_code, "message": "m"}}}
        ]
    return {"metadata": {"name": "corral-ev-unit"}, "status": status}


def test_evidence_starts_its_pod_then_records_the_verdict() -> None:
    start = plan_evidence(_evidence(), None, NOW)
    assert start.create_pod and start.status["verdict"] == "Pending"
    assert start.status["podName"] == "corral-ev-unit"
    running = plan_evidence(_evidence(start.status), _check_pod(None), NOW)
    assert not running.finished and not running.create_pod
    passed = plan_evidence(_evidence(start.status), _check_pod(0), LATER, "all good\n")
    assert passed.finished and passed.status["verdict"] == "Pass"
    assert passed.status["exitCode"] == 0 and passed.status["logTail"] == "all good\n"
    failed = plan_evidence(_evidence(start.status), _check_pod(2), LATER)
    assert failed.status["verdict"] == "Fail" and failed.status["exitCode"] == 2


def test_evidence_checkout_failure_is_an_error_not_a_fail() -> None:
    plan = plan_evidence(_evidence(), _check_pod(None, init_exit=128), NOW)
    assert plan.status["verdict"] == "Error" and plan.finished


def test_a_verdict_is_final() -> None:
    done = {"verdict": "Pass", "exitCode": 0}
    plan = plan_evidence(_evidence(done), _check_pod(1), LATER)
    assert plan.status["verdict"] == "Pass" and not plan.create_pod


def test_evidence_pod_is_clean_and_restricted() -> None:
    from corral_api.kinds import Evidence

    ev = Evidence.model_validate({k: _evidence()[k] for k in ("metadata", "spec")})
    pod = build_evidence_pod(ev, OperatorSettings())
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    assert all("secret" not in v and "projected" not in v for v in spec["volumes"])
    for c in [*spec["initContainers"], *spec["containers"]]:
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert all("valueFrom" not in e for e in c["env"])
    assert SHA in spec["initContainers"][0]["args"]
    assert spec["containers"][0]["command"] == ["sh", "-c", "make"]


# ------------------------------------------------------------------------------- Approval


def test_approval_must_bind_to_the_sessions_uid() -> None:
    approval = {
        "metadata": {"name": "ap"},
        "spec": {"sessionRef": {"name": "s", "uid": "u1"}, "action": {"tool": "land"}},
    }
    assert check_approval(approval, None).reason == "SessionNotFound"
    assert check_approval(approval, {"metadata": {"uid": "u2"}}).reason == "SessionMismatch"
    ok = check_approval(approval, {"metadata": {"uid": "u1"}})
    assert ok.reason == "ApprovalRequested" and "land" in ok.message
