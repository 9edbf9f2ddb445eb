"""Suspend and resume (issue 27; docs/turns.md, "Suspend and resume"): `corral suspend` parks
a Session, its turn in flight finishing first or aborted (`--now`), its conversation archived
and its pod deleted; the operator restarts while it is parked; `corral resume` brings it back in
a new pod at the same point, and it Succeeds with no turn run twice. On the real API server,
the local node and the scripted model, the operator under the chart's RBAC, the CLI as a real
process with a person's kubeconfig; the remote is a real `git daemon`."""

from __future__ import annotations

import subprocess
import sys
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
from .test_session_resume import _branch_files, _reasons, _texts
from .test_session_resume import archive_dir as archive_dir  # the fixtures this module uses
from .test_session_resume import operator_extras as operator_extras
from .test_session_resume import remote as remote

pytestmark = pytest.mark.timeout(240)

CORRAL = [sys.executable, "-m", "corral_cli.main"]
HELD = 6  # seconds the first model answer is held: the suspend arrives mid-turn


def _person(operator: OperatorHandle, who: str, verbs: list[str]) -> Path:
    """A kubeconfig for `who`, who may do `verbs` on Sessions in the test's namespace only."""
    ns, cp = operator.namespace, operator.cp
    if verbs:
        cp.kubectl("create", "role", f"{who}-sessions", "-n", ns, "--resource=sessions.corral.dev",
                   *(f"--verb={v}" for v in verbs))  # fmt: skip
        cp.kubectl("create", "rolebinding", f"{who}-sessions", "-n", ns,
                   f"--role={who}-sessions", f"--user={who}")  # fmt: skip
    return cp.user_kubeconfig(who)


def _corral(operator: OperatorHandle, kubeconfig: Path, *args: str) -> Any:
    cmd = [*CORRAL, *args, "-n", operator.namespace, "--kubeconfig", str(kubeconfig)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _in_flight(operator: OperatorHandle, name: str, turn: int) -> dict[str, Any] | None:
    ledger = operator.session_status(name).get("ledger")
    return ledger if ledger and ledger.get("turn") == turn else None


def _parked(operator: OperatorHandle, name: str) -> dict[str, Any] | None:
    status = operator.session_status(name)
    if status.get("phase") != "Suspended" or operator.get("pod", f"corral-{name}") is not None:
        return None
    return status


def _suspended_condition(status: dict[str, Any]) -> tuple[str, str]:
    found = next(c for c in status["conditions"] if c["type"] == "Suspended")
    return found["status"], found["reason"]


def test_suspended_after_its_turn_across_an_operator_restart_it_resumes_and_succeeds(
    operator: OperatorHandle,
    scripted_model: ScriptedModelHandle,
    remote: tuple[str, Path],
) -> None:
    url, bare = remote
    name = f"{operator.namespace}-after"
    scripted_model.load({"conversations": {name: [
        {"tool_use": {"name": "bash", "input": {"command": "echo one > ONE.md"}}, "delay": HELD},
        {"text": "Wrote ONE.md."},  # turn 1 ends: delivered; the guard wants another turn
        {"tool_use": {"name": "bash", "input": {"command": "cat ONE.md && echo two > TWO.md"}}},
        {"text": "ALL DONE: ONE.md and TWO.md."},
    ]}})  # fmt: skip
    session = session_doc(name, Path("."), evaluation={
        "criteria": {"substring": "ALL DONE"}, "turnBudget": 4})  # fmt: skip
    session["spec"]["workspace"]["repo"] = url
    operator.apply(agent_doc(), session)
    patcher = _person(operator, "suspender", ["get", "patch"])
    outsider = _person(operator, "outsider", [])

    wait_for("turn 1 in flight", lambda: _in_flight(operator, name, 1), 120)
    refused = _corral(operator, outsider, "suspend", name)
    assert refused.returncode == 2 and "forbidden" in refused.stderr.lower(), refused
    done = _corral(operator, patcher, "suspend", "session", name)
    assert done.returncode == 0 and "finishes first" in done.stdout, done

    # Turn 1 finished (and delivered); its follow-up was not admitted; the pod went.
    status = wait_for("parked, its pod gone", lambda: _parked(operator, name), 90)
    assert (status["turns"], status["suspensions"], status["suspendedFrom"]) == (1, 1, "Running")
    assert _suspended_condition(status) == ("True", "Suspended")
    assert "ONE.md" in _branch_files(bare, f"corral/{name}")
    assert len(scripted_model.requests(name)) == 2
    table = operator.cp.kubectl("get", "session", name, "-n", operator.namespace).stdout
    assert "Suspended" in table

    # The operator restarts while the Session is parked: it stays parked, with no pod.
    operator.stop()
    operator.start()
    time.sleep(5)
    assert _parked(operator, name) is not None
    assert len(scripted_model.requests(name)) == 2

    resumed = _corral(operator, patcher, "resume", name)
    assert resumed.returncode == 0, resumed
    status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=150)
    assert status["phase"] == "Succeeded", status
    assert (status["turns"], status["suspensions"], status.get("restarts", 0)) == (2, 1, 0)
    assert _suspended_condition(status) == ("False", "Unsuspended")
    requests = scripted_model.requests(name)
    assert len(requests) == 4, [_texts(r)[-200:] for r in requests]  # no turn ran twice
    # The new pod's harness had the conversation, and the workspace had turn 1's file.
    assert "Wrote ONE.md." in _texts(requests[2])
    assert "one" in str(requests[3]["body"]["messages"][-1])
    assert {"ONE.md", "TWO.md"} <= _branch_files(bare, f"corral/{name}")
    assert "conversation restored in the new pod" in operator.logs()
    assert _reasons(operator, name).count("Unsuspended") == 1


def test_suspended_now_the_turn_is_aborted_and_continues_after_the_resume(
    operator: OperatorHandle,
    scripted_model: ScriptedModelHandle,
    remote: tuple[str, Path],
) -> None:
    url, bare = remote
    name = f"{operator.namespace}-now"
    scripted_model.load({"conversations": {name: [
        {"text": "never seen: the turn is aborted first", "delay": HELD},
        {"tool_use": {"name": "bash", "input": {"command": "echo one > ONE.md"}}},
        {"text": "Wrote ONE.md."},
    ]}})  # fmt: skip
    session = session_doc(name, Path("."))
    session["spec"]["workspace"]["repo"] = url
    operator.apply(agent_doc(), session)
    patcher = _person(operator, "suspender", ["get", "patch"])

    wait_for("turn 1 in flight", lambda: _in_flight(operator, name, 1), 120)
    asked = time.monotonic()
    done = _corral(operator, patcher, "suspend", name, "--now")
    assert done.returncode == 0 and "aborted" in done.stdout, done
    status = wait_for("parked, its pod gone", lambda: _parked(operator, name), 60)
    assert status["turns"] == 0 and status["lastSettlement"]["status"] == "aborted"
    assert status["lastSettlement"]["error"].startswith("suspend:")

    assert _corral(operator, patcher, "resume", name).returncode == 0
    status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=150)
    assert status["phase"] == "Succeeded", status
    assert status["turns"] == 1  # the aborted attempt is not a turn of its own
    requests = scripted_model.requests(name)
    assert len(requests) == 3, [_texts(r)[-200:] for r in requests]
    assert "the session was suspended" in _texts(requests[1])
    assert "ONE.md" in _branch_files(bare, f"corral/{name}")
    # The aborted model call is still held at the scripted model: let it end there.
    time.sleep(max(0.0, HELD + 1 - (time.monotonic() - asked)))
