"""Approvals end to end on the real API server (docs/approvals.md, docs/ci.md).

A real harness (its policy answers `ask` for `land`), a real custodian under the chart's
sandbox identity, the scripted model over HTTP, a git daemon as the remote, and people as
client-certificate users of the control plane deciding with `corral approve` / `corral deny`
under the chart's approver role and ValidatingAdmissionPolicy. The Evidence verdicts are
written here as the operator writes them (the operator's own run of a check is
tests/cluster/test_operator_evidence.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corral_api.digest import action_digest, canonical_json
from corral_dev.controlplane import REPO_ROOT, ControlPlane
from tests.unit.custodian._custodian_proc import Custodian
from tests.wire._rig import Harness

from ._operator_fixtures import ScriptedModelHandle
from .test_custodian_cluster import (  # noqa: F401 - fixtures
    Start,
    apply,
    custodian,
    evidence_doc,
    git,
    kubectl_json,
    patch_status,
    repos,
    sandbox_token,
    session,
)

pytestmark = pytest.mark.timeout(180)

CORRAL = [sys.executable, "-m", "corral_cli.main"]
LANDER = {
    "identity": "You land reviewed work.",
    "model": "corral-scripted",
    "tools": {"allow": ["mcp__corral__land"]},
    "landing": {"targets": ["main"], "check": {"name": "unit", "command": "make test"}},
}


@dataclass
class People:
    alice: Path  # bound to the chart's approver role
    mallory: Path  # authenticated, no role


@pytest.fixture
def people(control_plane: ControlPlane, namespace: str) -> People:
    """The chart's approver role and admission policy; alice may decide, mallory may not."""
    rendered = subprocess.run(
        [
            str(control_plane.bin_dir / "helm"), "template", "corral",
            str(REPO_ROOT / "charts" / "corral"), "--kube-version", "1.34.4",
            "--show-only", "templates/approval-admission.yaml",
            "--set-json", f'watchNamespaces=["{namespace}"]',
        ],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    control_plane.kubectl("apply", "-f", "-", input=rendered)
    control_plane.kubectl(
        "create", "rolebinding", "alice-approves", "-n", namespace,
        "--clusterrole=corral-approver", "--user=alice",
    )  # fmt: skip
    groups = ["system:authenticated"]
    people = People(
        control_plane.user_kubeconfig("alice", groups),
        control_plane.user_kubeconfig("mallory", groups),
    )
    _wait_for_the_policy(control_plane, namespace, people.alice)
    return people


def _probe(namespace: str) -> dict[str, Any]:
    name = f"probe-{uuid.uuid4().hex[:8]}"
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Approval",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "sessionRef": {"name": "nobody", "uid": str(uuid.uuid4())},
            "action": {"tool": "noop", "arguments": "{}", "digest": action_digest("noop", {})},
        },
    }


def _forge(
    cp: ControlPlane, kubeconfig: Path, name: str, ns: str
) -> subprocess.CompletedProcess[str]:
    """alice writes a decision in bob's name."""
    body = {"status": {"decision": "Approved", "decidedBy": "bob"}}
    return cp.kubectl(
        "patch", "approval", name, "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps(body), kubeconfig=kubeconfig, check=False,
    )  # fmt: skip


def _wait_for_the_policy(cp: ControlPlane, namespace: str, alice: Path) -> None:
    """An admission policy is enforced once the API server has loaded it: probe until a forged
    decision is refused (each probe is a throwaway Approval)."""
    deadline = time.monotonic() + 30
    while True:
        probe = _probe(namespace)
        apply(cp, probe)
        if _forge(cp, alice, probe["metadata"]["name"], namespace).returncode != 0:
            return
        assert time.monotonic() < deadline, "the ValidatingAdmissionPolicy never took effect"
        time.sleep(0.5)


def corral(*args: str, kubeconfig: Path, namespace: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CORRAL, *args, "--kubeconfig", str(kubeconfig), "-n", namespace],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip


@pytest.fixture
def landing(
    control_plane: ControlPlane,
    namespace: str,
    custodian: Start,  # noqa: F811
    repos: tuple[Path, Path, str],  # noqa: F811
    scripted_model: ScriptedModelHandle,
    tmp_path: Path,
) -> Iterator[tuple[Harness, Custodian, dict[str, Any], str]]:
    """A Session `lander` whose harness (land always asks) talks to its custodian."""
    work, _, url = repos
    me = apply(control_plane, session("lander", namespace, repo=url))
    env = {
        "CORRAL_SESSION_BRANCH": "corral/lander",
        "CORRAL_GIT_REMOTE_URL": url,
    }
    with custodian(me, LANDER, **env) as running:
        harness = Harness(
            scripted_model.url,
            running.url,
            tmp_path / "harness-state",
            work,
            extra_env={
                "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(tmp_path / "custodian-credential"),
            },
        )
        harness.start()
        try:
            yield harness, running, me, url
        finally:
            harness.stop()


def _land_script(scripted_model: ScriptedModelHandle, conv: str, revision: str) -> None:
    scripted_model.load(
        {
            "conversations": {
                conv: [
                    {
                        "text": "Landing the reviewed revision.",
                        "tool_use": {
                            "name": "mcp__corral__land",
                            "input": {"target": "main", "revision": revision},
                        },
                    },
                    {"text": "Done."},
                ]
            }
        }
    )


def _session_approvals(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    items = kubectl_json(cp, "get", "approvals", "-n", namespace)["items"]
    return [a for a in items if a["spec"]["sessionRef"]["name"] == "lander"]


def _tool_end(harness: Harness, conv: str) -> dict[str, Any] | None:
    return next((e for e in harness.history(conv) if e["type"] == "tool_end"), None)


def _ask_to_land(
    cp: ControlPlane,
    namespace: str,
    harness: Harness,
    model: ScriptedModelHandle,
    revision: str,
) -> tuple[str, str, dict[str, Any]]:
    conv = f"c{uuid.uuid4().hex[:8]}"
    _land_script(model, conv, revision)
    admitted = harness.admit(conv, spec=LANDER)
    # The first model request pays the harness's start-up; a loaded machine is slow.
    asked = harness.wait_for(conv, "approval_requested", timeout=90)
    (approval,) = _session_approvals(cp, namespace)  # one Approval for the one action
    assert approval["metadata"]["name"] == asked["approvalId"]
    args = {"target": "main", "revision": revision}
    assert approval["spec"]["action"] == {
        "tool": "land",
        "arguments": canonical_json(args),
        "digest": action_digest("land", args),
    }
    return conv, str(admitted["submissionId"]), approval


def _evidence(cp: ControlPlane, ns: str, revision: str, url: str, verdict: str | None) -> None:
    apply(cp, evidence_doc(ns, "unit-at-rev", revision, url, "make test", "make test"))
    if verdict is not None:
        patch_status(
            cp, "evidence", "unit-at-rev", ns,
            {"verdict": verdict, "finished": "2026-11-30T10:00:00Z", "exitCode": 0},
        )  # fmt: skip


def test_land_is_asked_once_decided_by_a_person_and_lands_only_with_pass_evidence(
    control_plane: ControlPlane,
    namespace: str,
    landing: tuple[Harness, Custodian, dict[str, Any], str],
    repos: tuple[Path, Path, str],  # noqa: F811
    people: People,
    scripted_model: ScriptedModelHandle,
) -> None:
    harness, _, me, url = landing
    work, remote, _ = repos
    revision = git(work, "rev-parse", "HEAD")
    conv, submission, approval = _ask_to_land(
        control_plane, namespace, harness, scripted_model, revision
    )
    name = approval["metadata"]["name"]

    # Listed for people with the approver role.
    listed = corral("get", "approvals", kubeconfig=people.alice, namespace=namespace)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(name))
    assert "lander" in row and "land" in row and "Pending" in row

    # A decision from another scope releases nothing: the same action approved for another
    # Session uid (an admin writes it; the policy only asks that it names the admin).
    args = {"target": "main", "revision": revision}
    other = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Approval",
        "metadata": {"name": "other-scope", "namespace": namespace},
        "spec": {
            "sessionRef": {"name": "lander", "uid": str(uuid.uuid4())},
            "action": {"tool": "land", "arguments": canonical_json(args),
                       "digest": action_digest("land", args)},
        },
    }  # fmt: skip
    apply(control_plane, other)
    admin = corral("approve", "other-scope", kubeconfig=control_plane.kubeconfig,
                   namespace=namespace)  # fmt: skip
    assert admin.returncode == 0, admin.stderr

    # Mallory has no right on approvals/status: refused by RBAC, exit 2 (an error, docs/cli.md).
    refused = corral("approve", name, kubeconfig=people.mallory, namespace=namespace)
    assert refused.returncode == 2 and "forbidden" in refused.stderr.lower(), refused.stderr
    # Alice may decide, but not in bob's name: the admission policy refuses it.
    forged = _forge(control_plane, people.alice, name, namespace)
    assert forged.returncode != 0
    assert "status.decidedBy must be the user who decides (alice)" in forged.stderr

    time.sleep(2)  # the harness polls every second: give a wrong release time to happen
    assert _tool_end(harness, conv) is None
    assert git(remote, "rev-parse", "main") != revision

    # Alice approves in her own name; the landing check has no verdict yet, so the call waits.
    approved = corral("approve", name, "--reason", "reviewed", kubeconfig=people.alice,
                      namespace=namespace)  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    status = kubectl_json(control_plane, "get", "approval", name, "-n", namespace)["status"]
    assert (status["decision"], status["decidedBy"], status["comment"]) == (
        "Approved", "alice", "reviewed",
    )  # fmt: skip
    again = corral("deny", name, kubeconfig=people.alice, namespace=namespace)
    assert again.returncode == 1 and "already Approved" in again.stderr
    _evidence(control_plane, namespace, revision, url, None)  # the check is running
    time.sleep(2)
    assert _tool_end(harness, conv) is None
    assert git(remote, "rev-parse", "main") != revision

    # The verdict is Pass: the same call replays and lands.
    patch_status(
        control_plane, "evidence", "unit-at-rev", namespace,
        {"verdict": "Pass", "finished": "2026-11-30T10:00:00Z", "exitCode": 0},
    )  # fmt: skip
    settled = harness.wait_settled(conv, submission, timeout=60)
    assert settled["status"] == "completed"
    end = _tool_end(harness, conv)
    assert end is not None and end["isError"] is False, end
    assert git(remote, "rev-parse", "main") == revision
    assert len(_session_approvals(control_plane, namespace)) == 2  # its own, and other-scope
    assert me["metadata"]["uid"] == approval["spec"]["sessionRef"]["uid"]


def test_an_approved_land_with_a_failing_check_is_blocked(
    control_plane: ControlPlane,
    namespace: str,
    landing: tuple[Harness, Custodian, dict[str, Any], str],
    repos: tuple[Path, Path, str],  # noqa: F811
    people: People,
    scripted_model: ScriptedModelHandle,
) -> None:
    harness, _, _, url = landing
    work, remote, _ = repos
    revision = git(work, "rev-parse", "HEAD")
    conv, submission, approval = _ask_to_land(
        control_plane, namespace, harness, scripted_model, revision
    )
    _evidence(control_plane, namespace, revision, url, "Fail")
    approved = corral("approve", approval["metadata"]["name"], kubeconfig=people.alice,
                      namespace=namespace)  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    harness.wait_settled(conv, submission, timeout=60)
    end = _tool_end(harness, conv)
    assert end is not None and end["isError"] is True
    assert "says Fail" in end["result"]
    assert git(remote, "rev-parse", "main") != revision
    assert len(_session_approvals(control_plane, namespace)) == 1


def test_a_denied_land_never_runs(
    control_plane: ControlPlane,
    namespace: str,
    landing: tuple[Harness, Custodian, dict[str, Any], str],
    repos: tuple[Path, Path, str],  # noqa: F811
    people: People,
    scripted_model: ScriptedModelHandle,
) -> None:
    harness, _, _, _ = landing
    work, remote, _ = repos
    revision = git(work, "rev-parse", "HEAD")
    conv, submission, approval = _ask_to_land(
        control_plane, namespace, harness, scripted_model, revision
    )
    name = approval["metadata"]["name"]
    denied = corral("deny", name, "--reason", "not this week", kubeconfig=people.alice,
                    namespace=namespace)  # fmt: skip
    assert denied.returncode == 0, denied.stderr
    harness.wait_settled(conv, submission, timeout=60)
    blocked = [e for e in harness.history(conv) if e["type"] == "tool_end"]
    assert blocked == [] or blocked[0]["isError"] is True
    assert git(remote, "rev-parse", "main") != revision
    status = kubectl_json(control_plane, "get", "approval", name, "-n", namespace)["status"]
    assert (status["decision"], status["decidedBy"]) == ("Denied", "alice")


# ------------------------------------------------------------------------------ the CI gate


def _gate(namespace: str, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return corral("evidence", "check", *args, kubeconfig=kubeconfig, namespace=namespace)


def test_the_ci_gate_exits_by_the_verdict(control_plane: ControlPlane, namespace: str) -> None:
    repo = "https://git.example.test/shop.git"
    passed, failed, running = "a" * 40, "b" * 40, "c" * 40
    for name, revision, verdict in (
        ("unit-pass", passed, "Pass"),
        ("unit-fail", failed, "Fail"),
        ("unit-running", running, None),
    ):
        apply(control_plane, evidence_doc(namespace, name, revision, repo, "make test",
                                          "make test"))  # fmt: skip
        if verdict is not None:
            patch_status(control_plane, "evidence", name, namespace,
                         {"verdict": verdict, "finished": "2026-11-30T10:00:00Z"})  # fmt: skip
    # The CI job's identity: only the chart's evidence-reader role.
    rendered = subprocess.run(
        [
            str(control_plane.bin_dir / "helm"), "template", "corral",
            str(REPO_ROOT / "charts" / "corral"), "--kube-version", "1.34.4",
            "--show-only", "templates/evidence-reader-rbac.yaml",
            "--set-json", f'watchNamespaces=["{namespace}"]',
        ],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    control_plane.kubectl("apply", "-f", "-", input=rendered)
    control_plane.kubectl(
        "create", "rolebinding", "ci-reads-evidence", "-n", namespace,
        "--clusterrole=corral-evidence-reader", "--user=ci",
    )  # fmt: skip
    ci = control_plane.user_kubeconfig("ci", ["system:authenticated"])
    ok = _gate(namespace, ci, "--repo", repo, "--revision", passed, "--check", "unit")
    assert (ok.returncode, ok.stdout.splitlines()[-1]) == (0, "verdict: Pass"), ok.stderr
    assert "unit: Pass" in _gate(namespace, ci, "--repo", repo, "--revision", passed).stdout

    # The same CLI as a kubectl plugin (`kubectl-corral` on the PATH).
    plugin = subprocess.run(
        [str(control_plane.bin_dir / "kubectl"), "corral", "evidence", "check", "--repo", repo,
         "--revision", passed, "--kubeconfig", str(ci), "-n", namespace],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert (plugin.returncode, plugin.stdout.splitlines()[-1]) == (0, "verdict: Pass"), (
        plugin.stderr
    )

    fail = _gate(namespace, ci, "--repo", repo, "--revision", failed)
    assert (fail.returncode, fail.stdout.splitlines()[-1]) == (1, "verdict: Fail")

    no_check = _gate(namespace, ci, "--repo", repo, "--revision", passed, "--check", "lint")
    assert no_check.returncode == 2 and "no Evidence of check 'lint'" in no_check.stderr
    other_repo = _gate(namespace, ci, "--repo", repo + "x", "--revision", passed)
    assert other_repo.returncode == 2  # the repository hash is part of the selection

    started = time.monotonic()
    pending = _gate(namespace, ci, "--repo", repo, "--revision", running, "--wait", "3s")
    assert (pending.returncode, pending.stdout.splitlines()[-1]) == (3, "verdict: Pending")
    assert time.monotonic() - started >= 3

    # A verdict that arrives during the wait ends it.
    waiter = subprocess.Popen(
        [*CORRAL, "evidence", "check", "--repo", repo, "--revision", running, "--wait", "60s",
         "--kubeconfig", str(ci), "-n", namespace],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    time.sleep(3)
    patch_status(control_plane, "evidence", "unit-running", namespace,
                 {"verdict": "Pass", "finished": "2026-11-30T10:05:00Z"})  # fmt: skip
    out, err = waiter.communicate(timeout=60)
    assert (waiter.returncode, out.splitlines()[-1]) == (0, "verdict: Pass"), err

    # Unexpected errors exit 2, never 1: an unreachable API server, a bad revision.
    broken = control_plane.state_dir / "kubeconfig-broken"
    broken.write_text(control_plane.kubeconfig.read_text().replace(
        control_plane.server, "https://127.0.0.1:1"))  # fmt: skip
    unreachable = _gate(namespace, broken, "--repo", repo, "--revision", passed)
    assert unreachable.returncode == 2 and "error" in unreachable.stderr
    short = _gate(namespace, ci, "--repo", repo, "--revision", "abc123")
    assert short.returncode == 2 and "40-character" in short.stderr
