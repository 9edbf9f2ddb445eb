"""Protected branches, attacked: a Session on `main`, a custodian told to push to `main` with
the operator bypassed, and a land to a branch its Agent does not list (or with no targets).

The remotes are real (`git daemon` on loopback, which the custodian accepts); the commits the
custodian would push are real and sent to it as the harness sends them (a bundle), so each
refusal is the rule's and not a missing commit's.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .._scripted import tool_results
from ..cluster._operator_fixtures import OperatorHandle, ScriptedModelHandle, agent_doc
from ..unit.custodian._bundle_rig import AGENT, CONVERSATION, bundle_rig
from ..unit.custodian._custodian_proc import git, git_daemon

pytestmark = pytest.mark.timeout(300)

REPOS = Path.home() / ".cache" / "corral" / "test-repos"
MENU = "mcp__corral__"
# A commit the agent makes and the test can make too: same parent, tree, people and dates,
# so the same SHA, known before the session runs (a land's input is scripted in advance).
COMMIT_ENV = {
    "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@a", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@a",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}  # fmt: skip
AGENT_COMMIT = " ".join(f"{k}={v}" for k, v in COMMIT_ENV.items()) + " git commit -qm fix"


def _served(base_name: str) -> tuple[Path, Path]:
    """A bare repository with one commit on main, in a directory `git daemon` serves."""
    REPOS.mkdir(parents=True, exist_ok=True)
    base = Path(os.path.realpath(REPOS)) / f"{base_name}-{os.getpid()}-{time.monotonic_ns()}"
    seed = base / "seed"
    seed.mkdir(parents=True)
    git(seed, "init", "-q", "-b", "main")
    (seed / "README.md").write_text("# protected\n")
    git(seed, "add", "README.md")
    git(seed, "commit", "-qm", "init")
    bare = base / "repo.git"
    git(base, "clone", "-q", "--bare", str(seed), str(bare))
    return base, bare


def _ref(bare: Path, ref: str) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(bare), "rev-parse", "--verify", "-q", f"refs/heads/{ref}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip() or None


def _all_refs(bare: Path) -> dict[str, str]:
    out = git(bare, "for-each-ref", "--format=%(refname) %(objectname)")
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def _agents_commit(bare: Path, tmp: Path) -> str:
    """The SHA the agent's scripted commit will have."""
    work = tmp / "same-commit"
    git(tmp, "clone", "-q", str(bare), str(work))
    (work / "fix.txt").write_text("fix\n")
    git(work, "add", "fix.txt")
    subprocess.run(
        ["git", "commit", "-qm", "fix"], cwd=work, check=True, capture_output=True,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp), "GIT_CONFIG_NOSYSTEM": "1",
             **COMMIT_ENV},
    )  # fmt: skip
    return git(work, "rev-parse", "HEAD")


def _session(name: str, agent: str, repo: str, **workspace: str) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": name},
        "spec": {
            "agentRef": agent,
            "task": "Ship it.",
            "workspace": {"repo": repo, "ref": "main", **workspace},
        },
    }


def test_a_session_on_main_fails_before_a_pod_exists_and_main_is_untouched(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle
) -> None:
    base, bare = _served("protected-main")
    before = _all_refs(bare)
    name = "on-main"
    scripted_model.load(
        {"conversations": {name: [
            {"tool_use": {"name": "bash", "input": {"command": "echo x > x && git add x && "
                                                    "git -c user.name=a -c user.email=a@a "
                                                    "commit -qm x"}}},
            {"tool_use": {"name": MENU + "push", "input": {"branch": "main"}}},
            {"text": "Pushed to main."},
        ]}}
    )  # fmt: skip
    with git_daemon(base) as daemon:
        operator.apply(
            agent_doc(tools={"allow": ["bash", MENU + "*"]}),
            _session(name, "coder", daemon + "repo.git", branch="main"),
        )
        status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=60)
        assert status["phase"] == "Failed", status
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "InvalidSpec", failed
        message = status["message"]
        assert "spec.workspace.branch 'main' is outside Agent 'coder'" in message, message
        assert "spec.workspace.branches (corral/**)" in message, message
        # Refused before anything ran: no pod, no model call, and the remote is as it was.
        assert operator.get("pod", f"corral-{name}") is None
        assert scripted_model.requests(name) == []
        assert _all_refs(bare) == before


def test_the_custodian_refuses_main_when_the_operator_is_bypassed(tmp_path: Path) -> None:
    """A custodian started (as if by a bypassed operator) with CORRAL_SESSION_BRANCH=main
    under an Agent with the default patterns: the commit is in its mirror, yet neither push
    nor turn-end delivery sends anything to main."""
    with bundle_rig(tmp_path, CORRAL_SESSION_BRANCH="main") as rig:
        before = rig.remote_head("main")
        base = rig.client.get(f"/agents/{CONVERSATION}/bundle-base").json()["base"]
        assert base == before
        tip = rig.commit("fix.txt", "the agent's change\n")
        sent = rig.send(rig.bundle(base), tip)
        assert sent.status_code == 200, sent.text  # the custodian holds the commit
        pushed = rig.push()
        assert pushed["isError"] is True, pushed
        assert "pushes nothing" in pushed["content"], pushed
        assert "spec.workspace.branch 'main' is outside" in pushed["content"], pushed
        assert "corral/**" in pushed["content"], pushed
        for tool_input in ({"branch": "main"}, {"refspec": "HEAD:refs/heads/main"}):
            answer = rig.client.post(f"/agents/{CONVERSATION}/tools/push", json=tool_input)
            assert answer.json()["isError"] is True, answer.text
        record = rig.deliver(tip)
        assert record["state"] == "Failed", record
        assert "spec.workspace.branch 'main' is outside" in record["message"], record
        assert rig.remote_head("main") == before
        assert rig.remote_head() is None  # nor anywhere else


def test_the_custodian_refuses_the_branch_a_head_ref_resolves_to(tmp_path: Path) -> None:
    """The Agent's patterns allow `main`, the Session names no ref (the remote's HEAD, which is
    `main`) and `main` as its branch: the custodian resolves HEAD on the remote itself and
    pushes nothing there, as the checkout would refuse it."""
    agent = {**AGENT, "workspace": {"branches": ["main", "corral/**"]}}
    with bundle_rig(
        tmp_path, CORRAL_SESSION_BRANCH="main", CORRAL_AGENT_SPEC_JSON=json.dumps(agent)
    ) as rig:
        before = rig.remote_head("main")
        base = rig.client.get(f"/agents/{CONVERSATION}/bundle-base").json()["base"]
        tip = rig.commit("fix.txt", "the agent's change\n")
        assert rig.send(rig.bundle(base), tip).status_code == 200
        pushed = rig.push()
        assert pushed["isError"] is True, pushed
        assert "pushes nothing" in pushed["content"] and "'main'" in pushed["content"], pushed
        record = rig.deliver(tip)
        assert record["state"] == "Failed", record
        assert rig.remote_head("main") == before


def _approvals(operator: OperatorHandle) -> list[str]:
    listed = operator.cp.kubectl("get", "approvals", "-n", operator.namespace, "-o", "name")
    return listed.stdout.split()


@pytest.mark.parametrize(
    ("landing", "reason"),
    [
        (
            {"targets": ["release/*"]},
            "'main' is outside this Agent's spec.landing.targets (release/*)",
        ),
        ({}, "this Agent lists no landing targets: spec.landing.targets"),
    ],
    ids=["unlisted-target", "no-targets"],
)
def test_a_land_to_an_unlisted_target_is_refused_and_the_target_is_unchanged(
    operator: OperatorHandle,
    scripted_model: ScriptedModelHandle,
    tmp_path: Path,
    landing: dict[str, Any],
    reason: str,
) -> None:
    """The agent commits and lands on `main`, which its Agent does not list: the custodian
    refuses when the harness's gate asks for the Approval (no person is asked about a land no
    Approval could release; `land` itself refuses the same, tests/unit/custodian); `main` on
    the remote is unchanged."""
    base, bare = _served("protected-land")
    main_before = _ref(bare, "main")
    revision = _agents_commit(bare, tmp_path)
    name = "lander"
    scripted_model.load(
        {"conversations": {name: [
            {"tool_use": {"name": "bash", "input": {
                "command": f"echo fix > fix.txt && git add fix.txt && {AGENT_COMMIT}"
                           " && git rev-parse HEAD"}}},
            {"tool_use": {"name": MENU + "land",
                          "input": {"target": "main", "revision": revision}}},
            {"text": "Could not land on main."},
        ]}}
    )  # fmt: skip
    with git_daemon(base) as daemon:
        operator.apply(
            agent_doc(tools={"allow": ["bash", MENU + "land"]}, landing=landing),
            _session(name, "coder", daemon + "repo.git"),
        )
        status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=180)
        assert status["phase"] == "Succeeded", status
        logs = operator.pod_logs(f"corral-{name}")

    committed, blocked = tool_results(scripted_model.requests(name))
    assert revision in committed, committed  # the commit the land names exists
    # The call never ran: the custodian refused the gate's request with the rule's reason
    # (the harness logs it; the model is told the call was not approved).
    assert "landed" not in blocked and "denied" in blocked, blocked
    assert reason in logs, logs[-3000:]
    assert _ref(bare, "main") == main_before
    assert _approvals(operator) == []  # refused before any person was asked
