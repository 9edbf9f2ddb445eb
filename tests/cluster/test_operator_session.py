"""The operator on the real API server: Sessions applied with kubectl run through the wire.

Everything is real except the kubelet (the local node) and the model (the scripted server):
kube-apiserver with RBAC and Pod Security, kube-controller-manager's garbage collector, the
operator as a subprocess under the chart's RBAC, the harness and the custodian as processes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from ._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(150)


def _reasons(op: OperatorHandle, name: str) -> list[str]:
    return [e["reason"] for e in op.events(name)]


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == type_)


def test_a_session_applied_with_kubectl_runs_to_succeeded(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-hello"
    scripted_model.load({"conversations": {name: [{"text": "Hello. The task is done."}]}})
    operator.apply(agent_doc(), session_doc(name, git_repo))

    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    assert status["turns"] == 1
    assert status["lastSettlement"]["status"] == "completed"
    assert status["usage"]["outputTokens"] > 0
    assert "ledger" not in status  # nothing in flight once settled
    assert _condition(status, "Succeeded")["status"] == "True"
    assert _condition(status, "Progressing")["status"] == "False"
    assert len(scripted_model.requests(name)) == 1
    reasons = _reasons(operator, name)
    for wanted in ("SandboxCreating", "TurnAdmitted", "TurnSettled", "PhaseSucceeded"):
        assert wanted in reasons, reasons
    # The session is over: its pod goes (keepSandbox is false).
    wait_for("the sandbox pod to go", lambda: operator.get("pod", f"corral-{name}") is None)
    agent = operator.get("agent", "coder")
    assert agent is not None
    assert _condition(agent["status"], "Ready")["status"] == "True"


def test_an_evaluation_guard_that_fails_twice_then_passes_runs_three_turns(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-guard"
    replies = [{"text": "Not there yet."}, {"text": "Still working."}, {"text": "ALL GREEN now."}]
    scripted_model.load({"conversations": {name: replies}})
    guard = {"criteria": {"substring": "ALL GREEN"}, "turnBudget": 3}
    operator.apply(agent_doc(), session_doc(name, git_repo, evaluation=guard))

    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    assert status["turns"] == 3
    assert status["evaluationTurns"] == 3
    requests = scripted_model.requests(name)
    assert len(requests) == 3
    # The follow-up after a failed evaluation tells the model what the check found.
    last_user = requests[1]["body"]["messages"][-1]
    assert "ALL GREEN" in str(last_user)
    # Events follow the status they tell of: the last one may still be on its way.
    wait_for(
        "the passing evaluation's Event", lambda: "EvaluationPassed" in _reasons(operator, name)
    )
    assert _reasons(operator, name).count("EvaluationFailed") == 2


def test_an_evaluation_guard_stops_the_session_when_its_budget_is_spent(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-spent"
    scripted_model.load({"conversations": {name: [{"text": "no"}, {"text": "no"}]}})
    guard = {"criteria": {"substring": "yes"}, "turnBudget": 2}
    operator.apply(agent_doc(), session_doc(name, git_repo, evaluation=guard))

    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Failed"
    assert status["turns"] == 2
    assert _condition(status, "Failed")["reason"] == "EvaluationFailed"


def test_a_restarted_operator_reattaches_without_a_second_admission_or_pod(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-restart"
    # A slow first answer keeps the turn in flight while the operator dies.
    scripted_model.load({"conversations": {name: [{"text": "Finished at last.", "delay": 6}]}})
    operator.apply(agent_doc(), session_doc(name, git_repo))

    ledger = wait_for(
        "the turn in flight", lambda: operator.session_status(name).get("ledger"), timeout=60
    )
    pod = operator.get("pod", f"corral-{name}")
    assert pod is not None
    # Events are posted from a queue that a SIGKILL drops: the admission's is waited for, so
    # the count below tells a second admission from a lost Event.
    wait_for("the TurnAdmitted Event", lambda: "TurnAdmitted" in _reasons(operator, name), 20)
    operator.kill()
    operator.start()

    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    assert status["turns"] == 1
    assert status["lastSettlement"]["submissionId"] == ledger["submissionId"]
    assert len(scripted_model.requests(name)) == 1  # admitted once, answered once
    assert _reasons(operator, name).count("TurnAdmitted") == 1
    assert _reasons(operator, name).count("SandboxCreating") == 1
    # No second pod: the one pod made before the restart served the whole turn.
    after = operator.get("pod", f"corral-{name}")
    assert after is None or after["metadata"]["uid"] == pod["metadata"]["uid"]


def _process_with_env(marker: str) -> int | None:
    """The pid of a local process whose environment holds `marker` (a KEY=VALUE pair)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in environ:
            return int(entry.name)
    return None


def test_a_harness_killed_mid_turn_fails_the_turn_and_the_session_follows_its_policy(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-crash"
    scripted_model.load({"conversations": {name: [{"text": "too late", "delay": 20}]}})
    operator.apply(agent_doc(), session_doc(name, git_repo))

    wait_for("the turn in flight", lambda: operator.session_status(name).get("ledger"), 60)
    pod = operator.get("pod", f"corral-{name}")
    assert pod is not None
    ip = pod["status"]["podIP"]
    pid = wait_for(
        "the harness process", lambda: _process_with_env(f"CORRAL_HARNESS_ADDR={ip}:8080")
    )
    os.kill(pid, signal.SIGKILL)

    # The node restarts the container; the harness rebuilds the conversation and settles the
    # submission that was in flight `failed`. The policy for a failed turn ends the session.
    status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=90)
    assert status["phase"] == "Failed", status
    assert status["lastSettlement"]["status"] == "failed"
    assert _condition(status, "Failed")["reason"] == "TurnFailed"
    # Events are posted after the status they tell of is written: wait, do not sample once.
    wait_for("the settlement's Event", lambda: "TurnSettled" in _reasons(operator, name), 30)


def test_a_deleted_session_takes_its_pod_and_secret_with_it(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-gone"
    scripted_model.load({"conversations": {name: [{"text": "slow", "delay": 30}]}})
    operator.apply(agent_doc(), session_doc(name, git_repo))
    ledger = wait_for("the turn in flight", lambda: operator.session_status(name).get("ledger"))
    assert operator.get("secret", f"corral-{name}-wire") is not None
    assert operator.get("networkpolicy", f"corral-{name}") is not None

    started = time.monotonic()
    operator.cp.kubectl("delete", "session", name, "-n", operator.namespace, "--timeout=60s")
    # The daemon, stopping for the deletion, aborted the turn in flight before the Session went.
    wait_for("the abort event", lambda: "TurnAborted" in _reasons(operator, name))
    assert ledger["submissionId"]
    owned = [
        ("pod", f"corral-{name}"),
        ("secret", f"corral-{name}-wire"),
        ("networkpolicy", f"corral-{name}"),
    ]

    def all_collected() -> bool:
        return all(operator.get(kind, obj) is None for kind, obj in owned)

    wait_for("the pod, secret and policy to be collected", all_collected, 60)
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    ("agent_spec", "session_spec", "phase", "message"),
    [
        ({}, {"workspace": {"repo": "REPO", "ref": "--upload-pack=x"}}, "Failed", "start with '-'"),
        ({"tools": {"allow": ["bash"], "deny": ["*"]}}, {}, "Pending", "is not ready"),
        ({"sandbox": {"egress": [{"cidr": "nowhere"}]}}, {}, "Pending", "is not a CIDR"),
    ],
)
def test_bad_specs_are_refused_with_a_reason_in_status(
    operator: OperatorHandle,
    git_repo: Path,
    agent_spec: dict[str, Any],
    session_spec: dict[str, Any],
    phase: str,
    message: str,
) -> None:
    name = f"{operator.namespace}-bad"
    spec = dict(session_spec)
    if "workspace" in spec:
        spec["workspace"] = {**spec["workspace"], "repo": str(git_repo)}
    operator.apply(agent_doc(**agent_spec), session_doc(name, git_repo, **spec))

    def refused() -> dict[str, Any] | None:
        status = operator.session_status(name)
        ok = status.get("phase") == phase and message in (status.get("message") or "")
        return status if ok else None

    wait_for(f"session {name} refused: {message}", refused, timeout=30)
    assert operator.get("pod", f"corral-{name}") is None


def test_a_session_for_a_missing_agent_waits_and_starts_when_it_appears(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-later"
    scripted_model.load({"conversations": {name: [{"text": "done"}]}})
    operator.apply(session_doc(name, git_repo, agent="late-agent"))
    wait_for(
        "the missing agent to be reported",
        lambda: "not found" in (operator.session_status(name).get("message") or ""),
    )
    operator.apply(agent_doc("late-agent"))
    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status


def test_an_agent_changed_mid_session_reaches_the_next_submission(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-fresh"
    replies = [{"text": "first try", "delay": 5}, {"text": "FIXED now"}]
    scripted_model.load({"conversations": {name: replies}})
    guard = {"criteria": {"substring": "FIXED"}, "turnBudget": 2}
    operator.apply(agent_doc(), session_doc(name, git_repo, evaluation=guard))
    wait_for("turn 1 in flight", lambda: operator.session_status(name).get("ledger"), 60)
    operator.apply(agent_doc(instructions="Always mention the word PELICAN-7."))

    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    first, second = (str(r["body"].get("system")) for r in scripted_model.requests(name))
    assert "PELICAN-7" not in first
    assert "PELICAN-7" in second


def _refused(op: OperatorHandle, name: str, words: list[str]) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        status = op.session_status(name)
        message = status.get("message") or ""
        ok = status.get("phase") == "Failed" and all(w in message for w in words)
        return status if ok else None

    try:
        return wait_for(f"session {name} refused: {words}", probe, timeout=30)
    except AssertionError as err:
        raise AssertionError(f"{err}\nstatus: {op.session_status(name)}") from None


def test_a_budget_above_its_agents_is_marked_invalid_naming_the_field(
    operator: OperatorHandle, git_repo: Path
) -> None:
    """No CRD rule compares two objects: the operator does, before anything is created."""
    name = f"{operator.namespace}-rich"
    operator.apply(
        agent_doc(limits={"budget": {"tokens": 1000, "costUSD": 1}}),
        session_doc(name, git_repo, budget={"tokens": 5000}),
    )
    status = _refused(operator, name, ["spec.budget.tokens"])
    assert _condition(status, "Failed")["reason"] == "InvalidSpec"
    assert operator.get("pod", f"corral-{name}") is None
    assert operator.get("secret", f"corral-{name}-wire") is None


def test_a_hand_made_child_under_another_agent_is_refused(
    operator: OperatorHandle, git_repo: Path
) -> None:
    """A Session created by hand with a parentRef gets no more than a spawned child would:
    it must run under its parent's Agent unless that Agent lists its own."""
    parent = f"{operator.namespace}-boss"
    child = f"{operator.namespace}-stray"
    operator.apply(agent_doc("lead", orchestrator=True), agent_doc("coder"))
    # The parent need not run for the check: a spec its sandbox cannot make keeps it podless.
    operator.apply(
        session_doc(parent, git_repo, agent="lead", workspace={"repo": "x", "ref": "-bad"})
    )
    wait_for("the parent to be judged", lambda: operator.session_status(parent).get("phase"))
    boss = operator.get("session", parent)
    assert boss is not None
    uid = boss["metadata"]["uid"]
    operator.apply(
        session_doc(child, git_repo, agent="coder", parentRef={"name": parent, "uid": uid})
    )
    status = _refused(operator, child, ["spec.agentRef", "'coder'"])
    assert _condition(status, "Failed")["reason"] == "InvalidSpec"
    assert operator.get("pod", f"corral-{child}") is None

    # Listed in the parent's children.agents, the same kind of child is allowed past the check.
    allowed = f"{operator.namespace}-listed"
    operator.apply(agent_doc("lead", orchestrator=True, children={"agents": ["coder"]}))
    operator.apply(
        session_doc(allowed, git_repo, agent="coder", parentRef={"name": parent, "uid": uid})
    )

    def past_the_check() -> dict[str, Any] | None:
        status = operator.session_status(allowed)
        return status if status.get("podName") else None

    wait_for("the listed child to get its sandbox", past_the_check, timeout=30)


def test_a_hand_made_child_naming_a_gone_parent_is_refused(
    operator: OperatorHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-orphan"
    operator.apply(agent_doc())
    operator.apply(
        session_doc(name, git_repo, parentRef={"name": "no-such-parent", "uid": "u-123"})
    )
    status = _refused(operator, name, ["spec.parentRef", "not found"])
    assert _condition(status, "Failed")["reason"] == "InvalidSpec"


def test_a_secret_in_the_way_is_never_adopted(operator: OperatorHandle, git_repo: Path) -> None:
    name = f"{operator.namespace}-squat"
    operator.cp.kubectl(
        "create",
        "secret",
        "generic",
        f"corral-{name}-wire",
        "-n",
        operator.namespace,
        "--from-literal=token=" + "k" * 40,
        "--from-literal=custodian=" + "c" * 40,
    )
    operator.apply(agent_doc(), session_doc(name, git_repo))
    status = _refused(operator, name, [f"Secret corral-{name}-wire", "not owned by this Session"])
    assert _condition(status, "Failed")["reason"] == "ObjectInTheWay"
    assert operator.get("pod", f"corral-{name}") is None
    secret = operator.get("secret", f"corral-{name}-wire")
    assert secret is not None and not secret["metadata"].get("ownerReferences")
