"""The dev cluster's git remote: the example repository served by `git daemon`.

The examples name their repository `demo/repo`, relative to the YAML file: `corral run` copies
examples/demo/repo, and `make dev-cluster` serves a git copy of it at
git://ADDRESS:PORT/demo/repo, the base URL the operator resolves a relative `workspace.repo`
against (`--local-repo-root git://ADDRESS:PORT/`). So the examples apply unchanged on either
node, and a Session's work is delivered: the custodian pushes each turn's commits to the
Session's branch there and the revision is in its status. The address is 127.0.0.1 for the
local node (its pods are processes on this host) and this host's end of the link for the real
node (its pods reach it through the egress gateway).

The repository's one commit is made with a fixed author, committer and date, so its revision
is the same on every machine: examples/evidence.yaml names it, and a test fails if a change to
examples/demo/repo moves it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import _realnode_stack as rstack
from .controlplane import REPO_ROOT

DEMO_REPO_PATH = "demo/repo"
DEMO_SOURCE = REPO_ROOT / "examples" / "demo" / "repo"
# What makes the commit the same on every machine.
_COMMIT_ENV = {
    "GIT_AUTHOR_NAME": "Corral dev cluster",
    "GIT_AUTHOR_EMAIL": "dev@corral.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00+00:00",
    "GIT_COMMITTER_NAME": "Corral dev cluster",
    "GIT_COMMITTER_EMAIL": "dev@corral.invalid",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00+00:00",
    "GIT_CONFIG_GLOBAL": os.devnull,  # none of this user's hooks, signing or autocrlf
    "GIT_CONFIG_NOSYSTEM": "1",
}
COMMIT_MESSAGE = "The example repository, before the agent"


def demo_repository(dest: Path, source: Path = DEMO_SOURCE) -> str:
    """`source` copied to `dest` as a git repository with one commit on `main`; its revision."""
    shutil.copytree(
        source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(dest), **_COMMIT_ENV}
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        ["-c", "commit.gpgsign=false", "commit", "-q", "-m", COMMIT_MESSAGE],
    ):
        subprocess.run(["git", *args], cwd=dest, env=env, check=True, capture_output=True)
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=dest, env=env, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


@dataclass(frozen=True)
class DemoRemote:
    process: subprocess.Popen[bytes]
    address: str
    port: int

    @property
    def root_url(self) -> str:
        """The base URL a relative repo resolves under (the operator's `--local-repo-root`)."""
        return f"git://{self.address}:{self.port}/"


def serve(base: Path, address: str, log: Path | None = None, *, detach: bool = False) -> DemoRemote:
    """`git daemon` serving the repositories under `base`, clones and pushes, on a free port of
    `address`. Unauthenticated: only for the demo repository, on an address only this host and
    its pods reach."""
    port = rstack.free_port(address)
    process = rstack.start_git_daemon(base, address, port, log, detach=detach)
    return DemoRemote(process, address, port)
