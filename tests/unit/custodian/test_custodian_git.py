"""Push from the custodian, with the agent's repository full of traps: the custodian never
opens the workspace (its commits arrive as a bundle), so nothing planted there runs inside the
custodian, even with CORRAL_WORKSPACE still naming it; and local or command-running remotes are
refused."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ._custodian_proc import git, git_daemon, running_custodian

pytestmark = pytest.mark.timeout(90)

AGENT = json.dumps(
    {"identity": "x", "model": "claude-haiku-4-5", "tools": {"allow": ["mcp__corral__push"]}}
)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, Path, str]]:
    base = tmp_path / "served"
    base.mkdir()
    remote = base / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    work = tmp_path / "workspace"
    git(tmp_path, "clone", "-q", str(remote), str(work))
    git(work, "checkout", "-qb", "corral/s1")
    (work / "a.txt").write_text("one\n")
    git(work, "add", "a.txt")
    git(work, "commit", "-qm", "one")
    with git_daemon(base) as url:
        yield work, remote, url + "remote.git"


def push(url: str, headers: dict[str, str]) -> dict[str, object]:
    response = httpx.post(f"{url}/agents/c1/tools/push", json={}, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    answer: dict[str, object] = response.json()
    return answer


@pytest.mark.parametrize(
    ("remote", "fragment"),
    [
        ("file://{remote}", "file:// URL"),
        ("{remote}", "local path"),
        ("../served/remote.git", "local path"),
        ("ext::sh -c touch% {marker}", "transport helper"),
        ("fd::3", "transport helper"),
        ("ftp://example.invalid/r.git", "uses ftp://"),
    ],
)
def test_push_to_a_local_or_command_remote_is_refused(
    served: tuple[Path, Path, str], tmp_path: Path, remote: str, fragment: str
) -> None:
    _, bare, _ = served
    marker = tmp_path / "ext-ran"
    env = {
        "CORRAL_SESSION_BRANCH": "corral/s1",
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        "CORRAL_AGENT_SPEC_JSON": AGENT,
        "CORRAL_GIT_REMOTE_URL": remote.format(remote=bare, marker=marker),
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        answer = push(custodian.url, custodian.headers)
        assert answer["isError"] is True
        assert fragment in str(answer["content"]), answer
        assert "never allowed" in str(answer["content"]) or "allowed are" in str(answer["content"])
        assert "push and land will be refused" in custodian.log.read_text()
    assert git(bare, "for-each-ref") == ""  # nothing arrived
    assert not marker.exists()


def test_nothing_planted_in_the_workspace_runs_inside_the_custodian(
    served: tuple[Path, Path, str], tmp_path: Path
) -> None:
    work, bare, url = served
    markers = tmp_path / "markers"
    markers.mkdir()

    def trap(name: str) -> str:
        script = tmp_path / "traps" / name
        script.parent.mkdir(exist_ok=True)
        script.write_text(f'#!/bin/sh\ntouch "{markers}/{name}"\nexit 0\n')
        script.chmod(0o755)
        return str(script)

    # A filter driver for every path, committed before the traps are armed.
    (work / ".gitattributes").write_text("* filter=evil\n")
    git(work, "add", ".gitattributes")
    git(work, "commit", "-qm", "attributes")
    head = git(work, "rev-parse", "HEAD")
    # The tools side's bundle, written before the traps are armed (the harness's own git runs
    # there as the agent; what this test asks is whether the custodian ever runs any).
    bundle = tmp_path / "work.bundle"
    git(work, "bundle", "create", "-q", str(bundle), "HEAD")

    hook_names = (
        "pre-push", "pre-receive", "post-receive", "update", "post-update",
        "reference-transaction", "post-checkout", "pre-commit", "push-to-checkout",
        "fsmonitor-watchman",
    )  # fmt: skip
    hooks_dir = tmp_path / "planted-hooks"
    hooks_dir.mkdir()
    for name in hook_names:
        for where in (work / ".git" / "hooks", hooks_dir):
            (where / name).write_text(Path(trap(name)).read_text())
            (where / name).chmod(0o755)
    armed = {
        "core.hooksPath": str(hooks_dir),
        "core.fsmonitor": trap("fsmonitor"),
        "filter.evil.clean": trap("filter-clean"),
        "filter.evil.smudge": trap("filter-smudge"),
        "filter.evil.process": trap("filter-process"),
        "filter.evil.required": "true",
        "uploadpack.packObjectsHook": trap("pack-objects-hook"),
        "core.alternateRefsCommand": trap("alternate-refs"),
        "core.sshCommand": trap("ssh-command"),
        "core.askPass": trap("askpass"),
        "credential.helper": trap("credential-helper"),
        "diff.external": trap("diff-external"),
        "core.pager": trap("pager"),
        "remote.origin.url": "ext::" + trap("ext-origin"),
        f"url.ext::{trap('ext-insteadof')}.insteadOf": url,
    }
    for key, value in armed.items():
        subprocess.run(
            ["git", "config", key, value], cwd=work, check=True,
            env={"PATH": os.environ.get("PATH", ""), "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(work)},
        )  # fmt: skip

    env = {
        # Still set, as an older operator would: accepted and never used.
        "CORRAL_WORKSPACE": str(work),
        "CORRAL_SESSION_BRANCH": "corral/s1",
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        "CORRAL_AGENT_SPEC_JSON": AGENT,
        "CORRAL_GIT_REMOTE_URL": url,
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        sent = httpx.post(
            f"{custodian.url}/agents/c1/bundle", params={"revision": head},
            content=bundle.read_bytes(),
            headers={**custodian.headers, "content-type": "application/x-git-bundle"},
            timeout=60,
        )  # fmt: skip
        assert sent.status_code == 200, sent.text
        answer = push(custodian.url, custodian.headers)
        assert answer["isError"] is False, answer
        # Twice: the second push sends the same tip again (already on the remote).
        assert push(custodian.url, custodian.headers)["isError"] is False
    assert git(bare, "rev-parse", "refs/heads/corral/s1") == head
    assert sorted(p.name for p in markers.iterdir()) == []

    # The traps are live: git run in the workspace the ordinary way springs them.
    subprocess.run(
        ["git", "status", "--porcelain"], cwd=work, capture_output=True, check=False,
        stdin=subprocess.DEVNULL, timeout=30,
        env={"PATH": os.environ.get("PATH", ""), "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(work)},
    )  # fmt: skip
    assert (markers / "fsmonitor").exists()
