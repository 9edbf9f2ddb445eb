"""Evidence on the real API server and the local node: the check runs in its own clean pod at
the exact revision, and the verdict is written once. The operator creates the Evidence itself
when a landing Approval awaits a decision. Plus the TTL of a finished Session."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral_api.digest import check_definition_digest
from corral_api.evidence import verdict_for
from corral_api.labels import EVIDENCE_SESSION, evidence_labels, evidence_selector
from corral_operator import naming
from tests._objects import approval, evidence

from ._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(150)


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
    at_first = command.replace("REV", first)
    operator.apply(evidence(name, repo=str(git_repo), revision=first, command=at_first))

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
    operator.apply(evidence(name, repo=str(git_repo), revision="0" * 40, command="true"))
    status = wait_for(f"the verdict of {name}", lambda: _verdict(operator, name), 90)
    assert status["verdict"] == "Error"


def _head(repo: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def _evidences(op: OperatorHandle, selector: str | None = None) -> list[dict[str, Any]]:
    args = ["get", "evidences", "-n", op.namespace, "-o", "json"]
    if selector:
        args += ["-l", selector]
    done = op.cp.kubectl(*args)
    return list(json.loads(done.stdout).get("items") or [])


def test_a_land_approval_makes_the_operator_create_the_evidence_once(
    operator: OperatorHandle, git_repo: Path
) -> None:
    revision = _head(git_repo)
    # The sleep keeps the check pod around long enough to be looked at.
    command = 'sleep 3; test "$(git rev-parse HEAD)" = ' + revision
    check = {"name": "unit", "command": command}
    name = f"{operator.namespace}-lands"
    # A Session for a missing Agent (it never runs a turn) with its own landing check.
    operator.apply(session_doc(name, git_repo, agent="absent", landing={"check": check}))
    session = wait_for("the session", lambda: operator.get("session", name))
    uid = session["metadata"]["uid"]
    repo, digest = str(git_repo), check_definition_digest(command, None)
    selector = evidence_selector("unit", revision, repo)

    operator.apply(
        approval("land-1", name, uid, revision=revision, reason=f"land {revision} on main")
    )
    (evidence,) = wait_for("the Evidence", lambda: _evidences(operator, selector), 30)

    meta, spec = evidence["metadata"], evidence["spec"]
    assert evidence_labels("unit", revision, repo).items() <= meta["labels"].items()
    assert meta["labels"][EVIDENCE_SESSION] == name
    assert spec["definitionDigest"] == digest
    assert (spec["revision"], spec["repo"], spec["check"], spec["command"]) == (
        revision,
        repo,
        "unit",
        command,
    )
    assert "ownerReferences" not in meta  # a verdict outlives the Session that asked for it

    # Its NetworkPolicy: owned by the Evidence, selecting its pod, no ingress, and for a local
    # repository and a check without egress, no egress at all.
    policy_name = naming.evidence_pod_name(meta["name"])  # the pod's name, too
    policy = wait_for("the NetworkPolicy", lambda: operator.get("networkpolicy", policy_name), 30)
    assert policy["metadata"]["ownerReferences"][0]["uid"] == meta["uid"]
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert not policy["spec"].get("ingress") and not policy["spec"].get("egress")
    selected = policy["spec"]["podSelector"]["matchLabels"]

    # The check runs at the revision in its own pod, which that policy selects.
    pod = wait_for("the check pod", lambda: operator.get("pod", policy_name), 60)
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in selected.items())
    assert pod["spec"]["automountServiceAccountToken"] is False

    def finished() -> dict[str, Any] | None:
        found = operator.get("evidence", meta["name"]) or {}
        return found if (found.get("status") or {}).get("finished") else None

    done = wait_for("the verdict", finished, 90)
    assert done["status"]["verdict"] == "Pass", done["status"]
    assert verdict_for([done], "unit", revision, repo, digest) == "Pass"

    # A second Approval for the same revision, and the operator's own re-listing: no second one.
    operator.apply(
        approval("land-2", name, uid, revision=revision, reason=f"land {revision} on main")
    )
    wait_for(
        "the second approval to be seen",
        lambda: "ApprovalRequested" in [e["reason"] for e in operator.events("land-2")],
    )
    assert [e["metadata"]["name"] for e in _evidences(operator)] == [meta["name"]]
    reasons = [e["reason"] for e in operator.events("land-1")]
    assert "EvidenceRequested" in reasons
    assert "EvidenceRequested" not in [e["reason"] for e in operator.events("land-2")]


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
