"""A real custodian, a real remote (`git daemon`) and a workspace the test writes bundles from,
as the tools side does: the pieces the bundle tests and the bundle attacks share."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ._custodian_proc import Custodian, git, git_daemon, running_custodian

BRANCH = "corral/s1"
CONVERSATION = "c1"
BUNDLE_TYPE = {"content-type": "application/x-git-bundle"}
AGENT = {"identity": "x", "model": "claude-haiku-4-5", "tools": {"allow": ["mcp__corral__push"]}}


@dataclass
class BundleRig:
    custodian: Custodian
    client: httpx.Client
    work: Path  # the agent's workspace (the test plays the tools side in it)
    remote: Path  # the bare repository behind the git daemon
    state: Path  # the custodian's state directory
    tmp: Path

    def base(self) -> str | None:
        answer = self.client.get(f"/agents/{CONVERSATION}/bundle-base")
        assert answer.status_code == 200, answer.text
        assert answer.json()["branch"] == BRANCH
        base: str | None = answer.json()["base"]
        return base

    def commit(self, name: str, content: str | bytes) -> str:
        path = self.work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        git(self.work, "add", name)
        git(self.work, "commit", "-qm", f"add {name}")
        return git(self.work, "rev-parse", "HEAD")

    def bundle(self, base: str | None, tip: str = "HEAD", *refs: str) -> bytes:
        """`git bundle create` of the commits after `base` up to `tip`, as the tools side
        writes it."""
        out = self.tmp / "made.bundle"
        out.unlink(missing_ok=True)
        spec = [f"{base}..{tip}"] if base else [tip]
        git(self.work, "bundle", "create", "-q", str(out), *spec, *refs)
        return out.read_bytes()

    def send(self, data: bytes | Iterator[bytes], revision: str) -> httpx.Response:
        return self.client.post(
            f"/agents/{CONVERSATION}/bundle",
            params={"revision": revision},
            content=data,
            headers=BUNDLE_TYPE,
        )

    def deliver(self, revision: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"submissionId": "sub-1"}
        if revision is not None:
            body["revision"] = revision
        answer = self.client.post(f"/agents/{CONVERSATION}/deliver", json=body)
        assert answer.status_code == 200, answer.text
        record: dict[str, Any] = answer.json()
        return record

    def push(self) -> dict[str, Any]:
        answer = self.client.post(f"/agents/{CONVERSATION}/tools/push", json={})
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()
        return result

    def remote_head(self, branch: str = BRANCH) -> str | None:
        done = subprocess.run(
            ["git", "-C", str(self.remote), "rev-parse", "--verify", "-q", f"refs/heads/{branch}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        return done.stdout.strip() or None

    def mirror_refs(self) -> list[str]:
        mirror = self.state / "custodian-push.git"
        return git(mirror, "--git-dir", str(mirror), "for-each-ref", "--format=%(refname)").split()

    def incoming_left(self) -> list[Path]:
        incoming = self.state / "incoming"
        return list(incoming.rglob("*")) if incoming.exists() else []


@contextmanager
def bundle_rig(tmp_path: Path, **env: str) -> Iterator[BundleRig]:
    """A remote whose `main` has one commit, the workspace cloned from it on the session's
    branch, and a custodian (no CORRAL_WORKSPACE: it never opens one) pushing to it."""
    served = tmp_path / "served"
    served.mkdir()
    remote = served / "remote.git"
    seed = tmp_path / "seed"
    seed.mkdir()
    git(seed, "init", "-q", "-b", "main")
    (seed / "README.md").write_text("# repo\n")
    git(seed, "add", "README.md")
    git(seed, "commit", "-qm", "init")
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(remote))
    work = tmp_path / "workspace"
    git(tmp_path, "clone", "-q", str(remote), str(work))
    git(work, "checkout", "-qb", BRANCH)
    state = tmp_path / "state"
    with git_daemon(served) as daemon:
        full = {
            "CORRAL_SESSION_BRANCH": BRANCH,
            "CORRAL_STATE_DIR": str(state),
            "CORRAL_AGENT_SPEC_JSON": json.dumps(AGENT),
            "CORRAL_GIT_REMOTE_URL": daemon + "remote.git",
            **env,
        }
        with (
            running_custodian(full, tmp_path / "custodian.log") as custodian,
            custodian.client(timeout=60) as client,
        ):
            yield BundleRig(custodian, client, work, remote, state, tmp_path)


def send_head(url: str, headers: dict[str, str], work: Path, conversation: str = "c1") -> str:
    """What the harness does before delivery, push or land: bundle the workspace's commits
    since the custodian's bundle-base and send them, naming HEAD. HEAD's id."""
    base = httpx.get(f"{url}/agents/{conversation}/bundle-base", headers=headers, timeout=60)
    assert base.status_code == 200, base.text
    known = base.json()["base"]
    head = git(work, "rev-parse", "HEAD")
    data = b""
    if known != head:
        known_here = (
            known is not None
            and subprocess.run(
                ["git", "-C", str(work), "cat-file", "-e", f"{known}^{{commit}}"], check=False
            ).returncode
            == 0
        )
        out = work.parent / f"{work.name}-send.bundle"
        spec = f"{known}..HEAD" if known_here else "HEAD"
        made = subprocess.run(
            ["git", "-C", str(work), "bundle", "create", "-q", str(out), spec],
            capture_output=True, check=False,
        )  # fmt: skip
        if made.returncode == 0:  # else empty: HEAD is already in the custodian's history
            data = out.read_bytes()
            out.unlink()
    sent = httpx.post(
        f"{url}/agents/{conversation}/bundle", params={"revision": head}, content=data,
        headers={**headers, **BUNDLE_TYPE}, timeout=60,
    )  # fmt: skip
    assert sent.status_code == 200, sent.text
    return head


def raw_git(cwd: Path, *args: str, stdin: bytes | None = None) -> str:
    """git with the test's identity, reading `stdin` (for hash-object, mktree)."""
    done = subprocess.run(
        ["git", *args], cwd=cwd, input=stdin, capture_output=True, check=True,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1",
             "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
             "GIT_COMMITTER_EMAIL": "t@t"},
    )  # fmt: skip
    return done.stdout.decode().strip()
