"""`make dev-cluster` as a new user meets it: `python -m corral_dev up`, the examples applied
with kubectl into `default`, the session to Succeeded, `kubectl describe`, then `down` with no
process left behind. With ANTHROPIC_API_KEY set, the key reaches the model endpoint only
through the Agent's Secret. And a relative repo given to an operator without a local repo root
makes a Failed Session that says why."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral_dev.ports import free_port
from corral_dev.stack import process_alive, start_scripted_model, wait_serving

from ._operator_fixtures import (
    OperatorHandle,
    agent_doc,
    session_doc,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
# Outside /tmp: the local node maps a container's /tmp mount onto the host, so a repository
# path under /tmp in the pod's arguments would point into that volume (as in git_repo).
DEV_ROOT = Path.home() / ".cache" / "corral" / "test-dev"
COMPONENTS = {
    "etcd",
    "git-daemon",
    "kube-apiserver",
    "kube-controller-manager",
    "local-node",
    "model",
    "operator",
}


@pytest.fixture
def dev_dir() -> Iterator[Path]:
    DEV_ROOT.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="dev-", dir=DEV_ROOT))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _processes_under(path: Path) -> list[str]:
    """Processes whose working directory or command line is under `path` (pods' included)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or not process_alive(int(proc.name)):
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(str(path)) or str(path) in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]} (cwd {cwd})")
    return found


class DevCluster:
    """`python -m corral_dev` and kubectl as the user runs them, in their own dev dir."""

    def __init__(self, dev_dir: Path, **extra_env: str) -> None:
        self.dir = dev_dir
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("KUBECONFIG", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")
        }
        self.env.update(CORRAL_DEV_DIR=str(dev_dir), **extra_env)
        self.kubectl_bin: Path | None = None
        self.pids: dict[str, int] = {}

    def corral_dev(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "corral_dev", command],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def up(self) -> str:
        """`up`, checked: its exports, its processes, the demo repository. Returns stdout."""
        done = self.corral_dev("up")
        if (self.dir / "pids.json").exists():
            self.pids = json.loads((self.dir / "pids.json").read_text())
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        assert f"export KUBECONFIG={self.dir / 'kubeconfig'}\n" in done.stdout
        path_line = next(ln for ln in done.stdout.splitlines() if ln.startswith("export PATH="))
        self.kubectl_bin = Path(path_line.removeprefix("export PATH=").split(":", 1)[0]) / "kubectl"
        assert self.kubectl_bin.is_file(), path_line
        assert all(process_alive(pid) for pid in self.pids.values()), self.pids
        assert (self.dir / "repos" / "demo" / "repo" / ".git").is_dir()
        return done.stdout

    def kubectl(self, *args: str) -> str:
        assert self.kubectl_bin is not None
        done = subprocess.run(
            [str(self.kubectl_bin), *args],
            env={**self.env, "KUBECONFIG": str(self.dir / "kubeconfig")},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def wait_succeeded(self, session: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        phase = ""
        while phase != "Succeeded":
            phase = self.kubectl("get", "session", session, "-o", "jsonpath={.status.phase}")
            if phase == "Failed" or time.monotonic() > deadline:
                log = (self.dir / "state" / "logs" / "operator.log").read_text(errors="replace")
                status = self.kubectl("get", "session", session, "-o", "yaml")
                pytest.fail(f"session phase {phase!r}\n{status}\n--- operator log\n{log[-4000:]}")
            time.sleep(0.2)

    def down(self) -> None:
        """`down`, checked: every recorded process gone, and nothing else running from here."""
        if not self.pids and (self.dir / "pids.json").exists():
            self.pids = json.loads((self.dir / "pids.json").read_text())
        done = self.corral_dev("down")
        assert done.returncode == 0, done.stderr
        assert "killing" not in done.stdout, done.stdout  # everything stopped on SIGTERM
        assert not (self.dir / "pids.json").exists()
        assert [name for name, pid in self.pids.items() if process_alive(pid)] == []
        assert _processes_under(self.dir) == []


@pytest.mark.timeout(180)
def test_dev_cluster_up_runs_the_example_session_and_down_stops_everything(
    dev_dir: Path,
) -> None:
    dev = DevCluster(dev_dir)
    started = time.monotonic()
    try:
        dev.up()
        up_seconds = time.monotonic() - started
        assert set(dev.pids) == COMPONENTS

        # Idempotent: a second `up` starts nothing and prints the same exports.
        again = dev.up()
        assert "already running" in again
        assert json.loads((dev_dir / "pids.json").read_text()) == dev.pids

        # The user's commands, as the README gives them.
        dev.kubectl("apply", "-f", "examples/agent.yaml", "-f", "examples/session.yaml")
        dev.wait_succeeded("fix-discount")
        session_seconds = time.monotonic() - started - up_seconds

        described = dev.kubectl("describe", "session", "fix-discount")
        for shown in (
            "Phase:                Succeeded",
            "EvaluationPassed",  # a condition's reason and an event
            "TurnAdmitted",
            "PhaseSucceeded",
            "`python3 -m unittest -q` passed (exit 0)",
        ):
            assert shown in described, f"{shown!r} not in:\n{described}"
        # kubectl aligns a status key with its siblings, so only the value is fixed.
        assert re.search(r"^\s*Turns:\s+1$", described, re.M), described

        # Delivered: the fix is on the Session's branch of the git daemon `up` serves, and
        # its revision in the status (docs/operations.md, "Local development").
        revision = dev.kubectl(
            "get", "session", "fix-discount", "-o", "jsonpath={.status.delivery.revision}"
        )
        delivered = dev.kubectl(
            "get", "session", "fix-discount",
            "-o", "jsonpath={.status.conditions[?(@.type=='Delivered')].status}",
        )  # fmt: skip
        assert (len(revision), delivered) == (40, "True"), (revision, delivered)
        served = dev_dir / "repos" / "demo" / "repo"
        branch = subprocess.run(
            ["git", "-C", str(served), "rev-parse", "refs/heads/corral/fix-discount"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert branch == revision
        assert revision in dev.kubectl("get", "session", "fix-discount", "-o", "wide")

        # The scripted model played the whole demo: run tests, read, edit, test again, report.
        model = json.loads((dev_dir / "info.json").read_text())["model"]
        requests = httpx.get(f"{model}/_requests", timeout=10).json()
        assert len(requests) == 5, requests
    finally:
        dev.down()
    print(f"up {up_seconds:.1f}s, session {session_seconds:.1f}s")


@pytest.mark.timeout(180)
def test_with_an_api_key_the_key_reaches_the_model_through_the_agents_secret(
    dev_dir: Path,
) -> None:
    """ANTHROPIC_API_KEY set: no scripted model of its own; the upstream is ANTHROPIC_BASE_URL
    (here a scripted server standing in for Anthropic, which records the headers it gets), and
    the key gets there only because the Agent references the Secret `up` made."""
    port = free_port()
    model_log = dev_dir.parent / f"{dev_dir.name}-anthropic.log"
    stand_in = start_scripted_model(port, EXAMPLES / "demo" / "scenario.yaml", model_log)
    key = "sk-ant-dev-cluster-test-" + dev_dir.name
    url = f"http://127.0.0.1:{port}"
    dev = DevCluster(dev_dir, ANTHROPIC_API_KEY=key, ANTHROPIC_BASE_URL=url)
    try:
        wait_serving("the stand-in model", f"{url}/_requests", stand_in, model_log)
        out = dev.up()
        assert set(dev.pids) == COMPONENTS - {"model"}
        assert "kubectl patch agent fixer" in out
        assert key not in out
        environ = Path(f"/proc/{dev.pids['operator']}/environ").read_bytes()
        assert key.encode() not in environ  # the operator never holds the model key

        dev.kubectl("apply", "-f", "examples/agent.yaml")
        patch = next(ln.strip() for ln in out.splitlines() if "kubectl patch agent" in ln)
        dev.kubectl(*shlex.split(patch)[1:])
        dev.kubectl("apply", "-f", "examples/session.yaml")
        dev.wait_succeeded("fix-discount")

        requests = httpx.get(f"{url}/_requests", timeout=10).json()
        assert len(requests) == 5
        assert {r["headers"].get("x-api-key") for r in requests} == {key}
    finally:
        try:
            dev.down()
        finally:
            stand_in.terminate()
            stand_in.wait(timeout=10)
            model_log.unlink(missing_ok=True)


@pytest.mark.timeout(120)
def test_a_relative_repo_without_a_local_repo_root_fails_with_the_reason(
    operator: OperatorHandle,
) -> None:
    operator.apply(agent_doc(), session_doc("relative", Path("demo/repo")))
    status = operator.wait_phase("relative", {"Failed", "Succeeded"}, timeout=60)
    assert status["phase"] == "Failed"
    assert "'demo/repo' is a relative path" in status["message"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert operator.get("pod", "corral-relative") is None  # nothing was created for it
