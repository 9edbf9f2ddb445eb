"""Evidence on the real API server and the local node: the check runs in its own clean pod at
the exact revision, and the verdict is written once. Plus the TTL of a finished Session."""

from __future__ import annotations

import subprocess
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


def _evidence(name: str, repo: Path, revision: str, command: str) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Evidence",
        "metadata": {"name": name},
        "spec": {"repo": str(repo), "revision": revision, "check": "unit", "command": command},
    }


def _verdict(op: OperatorHandle, name: str) -> dict[str, Any] | None:
    status = (op.get("evidence", name) or {}).get("status") or {}
    return status if status.get("verdict") in ("Pass", "Fail", "Error") else None


@pytest.mark.parametrize(
    ("command", "verdict", "exit_code"),
    [('test -f README.md && test "$(git rev-parse HEAD)" = REV', "Pass", 0), ("exit 3", "Fail", 3)],
)
def test_evidence_runs_its_check_at_the_revision_and_records_the_verdict(
    operator: OperatorHandle, git_repo: Path, command: str, verdict: str, exit_code: int
) -> None:
    # A second commit on main: the check must see the first one, the revision it names.
    first = subprocess.run(
        ["git", "-C", str(git_repo), "rev-parse", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (git_repo / "later.txt").write_text("later\n")
    subprocess.run(["git", "-C", str(git_repo), "add", "later.txt"], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(git_repo),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "later",
        ],
        check=True,
    )
    name = f"{operator.namespace}-ev"
    operator.apply(_evidence(name, git_repo, first, command.replace("REV", first)))

    status = wait_for(f"the verdict of {name}", lambda: _verdict(operator, name), 90)
    assert status["verdict"] == verdict, status
    assert status["exitCode"] == exit_code
    assert status["finished"] and status["started"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == ("True" if verdict == "Pass" else "False")
    # The check pod is gone once the verdict is written.
    wait_for("the check pod to go", lambda: operator.get("pod", status["podName"]) is None, 30)


def test_evidence_at_a_revision_that_does_not_exist_is_an_error(
    operator: OperatorHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-ev-missing"
    operator.apply(_evidence(name, git_repo, "0" * 40, "true"))
    status = wait_for(f"the verdict of {name}", lambda: _verdict(operator, name), 90)
    assert status["verdict"] == "Error"


def test_a_finished_session_is_deleted_after_its_ttl(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-ttl"
    scripted_model.load({"conversations": {name: [{"text": "done"}]}})
    operator.apply(agent_doc(), session_doc(name, git_repo, ttlSecondsAfterFinished=2))
    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded"
    wait_for("the Session to be deleted", lambda: operator.get("session", name) is None, 30)


def test_keep_sandbox_keeps_the_pod_after_the_session_ends(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-keep"
    scripted_model.load({"conversations": {name: [{"text": "done"}]}})
    operator.apply(agent_doc(), session_doc(name, git_repo, keepSandbox=True))
    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded"

    def kept() -> dict[str, Any] | None:
        conds = operator.session_status(name).get("conditions") or []
        ready: dict[str, Any] = next((c for c in conds if c["type"] == "Ready"), {})
        return ready if ready.get("reason") == "SandboxKept" else None

    wait_for("the Ready condition to say the sandbox is kept", kept, 20)
    pod = operator.get("pod", f"corral-{name}")
    assert pod is not None and not pod["metadata"].get("deletionTimestamp")
