"""The checkout init container trusts nothing of the agent's (docs/security.md, "the checkout").

Its anatomy on the built pod, then its real command (sh + git, the argv and env the pod builder
makes, each mount path rewritten to a directory as the local node rewrites it) run twice on one
workspace against a git server that asks for credentials, with the agent's traps planted
between the runs: git configuration in its HOME, /tmp and XDG directory, and in the
workspace's `.git/config` and hooks. None may spring, the second checkout must be clean, and
the same traps must spring for a git that reads them (so the test can fail).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral_dev._node_spec import remap
from corral_operator.builders.podbuilder import build_pod
from corral_operator.settings import OperatorSettings
from tests._git_http import GitHttp, git_traps, sprung_traps
from tests._objects import agent, session

pytestmark = pytest.mark.timeout(60)

SETTINGS = OperatorSettings(image="corral/sandbox:test")
TOKEN = "checkout-canary-token-5f3a9c"
CREDENTIALS = {"credentials": {"gitSecretRef": {"name": "git-creds", "key": "credentials"}}}


def _pod(repo: str = "https://git.example/repo.git") -> dict[str, Any]:
    return build_pod(
        agent(**CREDENTIALS), session(workspace={"repo": repo, "ref": "main"}), SETTINGS
    )


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod["spec"]
    return {c["name"]: c for c in [*spec["initContainers"], *spec["containers"]]}


def test_the_checkout_has_a_home_of_its_own_and_no_git_configuration_file() -> None:
    pod = _pod()
    containers = _containers(pod)
    checkout = containers["checkout"]
    mounts = {m["mountPath"]: m["name"] for m in checkout["volumeMounts"]}
    assert mounts == {
        "/workspace": "workspace",
        "/tmp": "checkout-home",
        "/var/run/corral/git": "git-credentials",
    }
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "emptyDir" in volumes["checkout-home"]
    # No other container mounts its HOME, and it mounts nothing the agent's container has but
    # the workspace (which it empties before git runs).
    for name, container in containers.items():
        if name != "checkout":
            assert "checkout-home" not in {m["name"] for m in container["volumeMounts"]}, name
    tools = {m["name"] for m in containers["tools"]["volumeMounts"]}
    assert tools & set(mounts.values()) == {"workspace"}
    assert checkout["env"] == [
        {"name": "HOME", "value": "/tmp"},
        {"name": "GIT_TERMINAL_PROMPT", "value": "0"},
        {"name": "GIT_CONFIG_NOSYSTEM", "value": "1"},
        {"name": "GIT_CONFIG_GLOBAL", "value": "/dev/null"},
    ]
    # The credentials file is named on the command line only: no helper in any config file.
    assert checkout["args"][-1] == "/var/run/corral/git/credentials"


def _git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return done.stdout.strip()


class Pod:
    """The checkout's volumes as directories, and its command as the local node would run it."""

    def __init__(self, root: Path, repo_url: str, credentials_line: str) -> None:
        self.workspace = root / "volumes" / "workspace"
        self.agent_tmp = root / "volumes" / "tools-tmp"  # the agent's HOME and /tmp
        self.home = root / "volumes" / "checkout-home"
        self.git_dir = root / "volumes" / "git-credentials"
        for d in (self.workspace, self.agent_tmp, self.home, self.git_dir):
            d.mkdir(parents=True)
        self.credentials = self.git_dir / "credentials"
        self.credentials.write_text(credentials_line + "\n")
        self.credentials.chmod(0o444)
        self.container = _containers(_pod(repo_url))["checkout"]

    def mounts(self) -> list[tuple[str, str]]:
        by_name = {
            "workspace": self.workspace,
            "checkout-home": self.home,
            "git-credentials": self.git_dir,
        }
        return [(m["mountPath"], str(by_name[m["name"]])) for m in self.container["volumeMounts"]]

    def run_checkout(self) -> subprocess.CompletedProcess[str]:
        mounts = self.mounts()
        env = {e["name"]: remap(e["value"], mounts) for e in self.container["env"]}
        argv = [remap(a, mounts) for a in [*self.container["command"], *self.container["args"]]]
        return subprocess.run(
            argv, env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True,
            timeout=30,
        )  # fmt: skip

    def plant(self, repo_url: str) -> None:
        """What the agent's shell can do between two runs: its HOME and /tmp, the workspace."""
        script = git_traps(
            home=str(self.agent_tmp), tmp=str(self.agent_tmp), workspace=str(self.workspace),
            credentials=str(self.credentials), victim_url=repo_url,
            marks=[str(self.agent_tmp), str(self.workspace), str(self.home)],
        )  # fmt: skip
        env = {"PATH": os.environ["PATH"], "HOME": str(self.agent_tmp)}
        env["XDG_CONFIG_HOME"] = str(self.agent_tmp / ".config")
        done = subprocess.run(
            ["sh", "-c", script], cwd=self.workspace, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0 and "planted" in done.stdout, done.stderr

    def sprung(self) -> list[str]:
        return sprung_traps(self.workspace, self.agent_tmp, self.home)


@pytest.fixture
def origin(tmp_path: Path) -> tuple[Path, str]:
    """A bare repository on the git server, with one commit on main; its commit."""
    work = tmp_path / "origin-work"
    work.mkdir()
    _git("init", "-q", "-b", "main", cwd=work)
    (work / "README.md").write_text("the real repository\n")
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "real", cwd=work)
    served = tmp_path / "served"
    served.mkdir()
    _git("clone", "-q", "--bare", str(work), str(served / "repo.git"))
    return served, _git("rev-parse", "HEAD", cwd=work)


def test_a_rerun_after_the_agent_planted_git_traps_springs_none_and_starts_clean(
    tmp_path: Path, origin: tuple[Path, str]
) -> None:
    served, commit = origin
    with GitHttp(served, "corral", TOKEN) as server:
        url = f"{server.url}/repo.git"
        pod = Pod(tmp_path / "pod", url, server.url.replace("://", f"://corral:{TOKEN}@"))
        first = pod.run_checkout()
        assert first.returncode == 0, first.stderr
        assert ("/repo.git/info/refs", "corral") in server.requests  # the credentials worked
        pod.plant(url)
        asked = len(server.requests)

        second = pod.run_checkout()
        assert second.returncode == 0, second.stderr
        # It went to the real server again, with the real credentials: no insteadOf applied.
        assert ("/repo.git/info/refs", "corral") in server.requests[asked:]

    assert pod.sprung() == []
    ws = pod.workspace
    assert _git("rev-parse", "HEAD", cwd=ws) == commit
    assert _git("rev-parse", "--abbrev-ref", "HEAD", cwd=ws) == "corral/fix-bug"
    assert _git("status", "--porcelain", "--ignored", cwd=ws) == ""
    assert sorted(p.name for p in ws.iterdir()) == [".git", "README.md"]
    config = (ws / ".git" / "config").read_text()
    for planted in ("hooksPath", "fsmonitor", "askPass", "sshCommand", "helper", "insteadOf"):
        assert planted not in config
    assert not (ws / ".git" / "hooks").exists()  # no templates either
    assert TOKEN not in config + second.stderr + second.stdout
    # The agent's HOME kept its traps (the checkout never reached it to read them).
    assert (pod.agent_tmp / ".gitconfig").exists()


def test_the_same_traps_spring_for_a_git_that_reads_them(
    tmp_path: Path, origin: tuple[Path, str]
) -> None:
    """The control: a checkout with the agent's /tmp as HOME (as it had before) and git run in
    the agent's repository falls to the traps, so the test above could fail."""
    served, _ = origin
    with GitHttp(served, "corral", TOKEN) as server:
        url = f"{server.url}/repo.git"
        pod = Pod(tmp_path / "pod", url, server.url.replace("://", f"://corral:{TOKEN}@"))
        assert pod.run_checkout().returncode == 0
        pod.plant(url)
        env = {"PATH": os.environ["PATH"], "HOME": str(pod.agent_tmp)}
        subprocess.run(["git", "status"], cwd=pod.workspace, env=env, capture_output=True)
        subprocess.run(
            ["git", "clone", "-q", url, str(tmp_path / "naive")], env=env, capture_output=True
        )
    sprung = pod.sprung()
    names = {Path(p).name for p in sprung}
    assert "corral-trap-workspace-fsmonitor" in names  # the workspace's own config
    # The HOME's hooksPath (the last of the two plants in the one file when HOME is /tmp).
    assert "corral-trap-tmp-hook-post-checkout" in names
    assert (tmp_path / "naive" / "evil.txt").exists()  # the HOME's insteadOf
    # And what a trap that ran could take: the credentials file, as the checkout mounts it.
    assert any(TOKEN in Path(p).read_text() for p in sprung if "stolen" in p)


def test_a_clone_that_cannot_connect_yet_is_tried_again_and_a_missing_repository_is_not(
    tmp_path: Path, origin: tuple[Path, str]
) -> None:
    """A new pod's first connections may be refused while the network programs its policy:
    the checkout tries a clone that could not connect again (here the server comes up 2 s
    after the checkout started), and fails at once on an answer that is final."""
    import threading
    import time

    from corral_dev.ports import free_port

    served, commit = origin
    port = free_port()
    pod = Pod(tmp_path / "pod", f"git://127.0.0.1:{port}/repo.git", "https://x:y@unused")
    daemon: list[subprocess.Popen[bytes]] = []

    def serve_late() -> None:
        time.sleep(2)
        argv = [
            "git", "daemon", "--reuseaddr", "--export-all", f"--base-path={served}",
            "--listen=127.0.0.1", f"--port={port}", str(served),
        ]  # fmt: skip
        daemon.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    late = threading.Thread(target=serve_late)
    late.start()
    try:
        started = time.monotonic()
        done = pod.run_checkout()
        late.join()
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started >= 2
        assert _git("rev-parse", "HEAD", cwd=pod.workspace) == commit
        assert "connect" in done.stderr.lower()  # the tries before the server came up

        missing = Pod(tmp_path / "missing", f"git://127.0.0.1:{port}/nope.git", "https://x:y@u")
        started = time.monotonic()
        refused = missing.run_checkout()
        assert refused.returncode != 0 and time.monotonic() - started < 2, refused.stderr
    finally:
        late.join()
        for proc in daemon:
            proc.terminate()
            proc.wait(10)
