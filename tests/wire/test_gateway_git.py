"""git through the gateway as the custodian: a git:// clone of a repository of some size and a
push, tunnelled by `corral-proxy-tunnel` (GIT_PROXY_COMMAND) with the Session's proxy
credential, against a real `git daemon` and a real corral-gateway. The tunnel must outlast
git's closing of its own side: the pack arrives after git has sent everything it will."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from corral_dev._realnode_stack import start_git_daemon
from corral_dev.ports import free_port

from ._gateway import binding, start_gateway, write_bindings

pytestmark = pytest.mark.timeout(90)

GIT_HOST = "127.0.0.5"  # the git daemon; --allow-range makes it a public address here
CREDENTIAL = "custodian-proxy-credential-for-git"


def _git(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_clone_and_a_push_tunnel_through_the_gateway_with_the_custodians_credential(
    tmp_path: Path,
) -> None:
    base = tmp_path / "served"
    repo = base / "repo"
    repo.mkdir(parents=True)
    _git("init", "-q", "-b", "main", cwd=repo)
    # Incompressible content in several files: a pack of about 6 MiB, many reads long.
    for i in range(6):
        (repo / f"blob-{i}.bin").write_bytes(os.urandom(1 << 20))
    _git("add", ".", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "content", cwd=repo)
    port = free_port()
    daemon = start_git_daemon(base, GIT_HOST, port, tmp_path / "daemon.log")
    bindings = tmp_path / "bindings.json"
    rules = [{"host": GIT_HOST, "ports": [port], "private": False}]
    custodian = binding(
        namespace="team", session="s1", agent="coder", credential=CREDENTIAL, custodian_rules=rules
    )
    write_bindings(bindings, [("127.0.0.1", "uid-1", custodian)])
    gateway = start_gateway(
        tmp_path / "gw", ["--bindings-file", str(bindings), "--allow-range", f"{GIT_HOST}/32"]
    )
    tunnel = (
        shutil.which("corral-proxy-tunnel") or f"{Path(sys.executable).parent}/corral-proxy-tunnel"
    )
    env = {
        **{k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
        "HTTPS_PROXY": f"http://custodian:{CREDENTIAL}@127.0.0.1:{gateway.proxy_port}",
        "GIT_PROXY_COMMAND": tunnel,
        "GIT_TERMINAL_PROMPT": "0",
    }
    try:
        clone = tmp_path / "clone"
        _git("clone", "-q", f"git://{GIT_HOST}:{port}/repo", str(clone), env=env)
        for i in range(6):
            assert (clone / f"blob-{i}.bin").read_bytes() == (repo / f"blob-{i}.bin").read_bytes()
        (clone / "new.txt").write_text("from the custodian\n")
        _git("add", "new.txt", cwd=clone)
        _git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "new", cwd=clone)
        _git("push", "-q", "origin", "HEAD:refs/heads/session", cwd=clone, env=env)
        assert (
            _git("rev-parse", "session", cwd=repo).strip()
            == _git("rev-parse", "HEAD", cwd=clone).strip()
        )
        # Without the credential the same clone is the agent's, which has no rule for it.
        agent = {**env, "HTTPS_PROXY": f"http://127.0.0.1:{gateway.proxy_port}"}
        refused = subprocess.run(
            ["git", "clone", "-q", f"git://{GIT_HOST}:{port}/repo", str(tmp_path / "no")],
            env=agent, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert refused.returncode != 0 and "403" in refused.stderr, refused.stderr
        decided = {(d["identity"], d["decision"]) for d in gateway.decisions() if "identity" in d}
        assert ("custodian", "allowed") in decided and ("agent", "denied") in decided
    finally:
        gateway.stop()
        daemon.terminate()
        daemon.wait(timeout=10)
