"""Both workspaces over the same kind of tree: in-process, and the real `corral-exec` binary."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from corral_harness.ports import Workspace
from corral_harness.tools import LocalWorkspace, WorkingTools
from corral_harness.tools._exec_client import ExecWorkspace

from ._service import ExecService, pid_dead

# What the service and the harness carry that a command must never see.
SECRET_ENV = {
    "CORRAL_WIRE_TOKEN_FILE": "/var/run/corral/token",
    "CORRAL_CUSTODIAN_CREDENTIAL_FILE": "/var/run/corral/credential",
    "CORRAL_TEST_SECRET": "corral-secret-value",
    "ANTHROPIC_API_KEY": "sk-ant-test-secret",
    "ANTHROPIC_BASE_URL": "http://custodian.invalid",
}


def build_tree(base: Path) -> Path:
    """root/ with files, a subdirectory, links in and out, a dangling link; outside/ beside it."""
    root, outside = base / "root", base / "outside"
    for path in (root, outside):
        if path.exists():
            shutil.rmtree(path)
    (root / "pkg" / "deep").mkdir(parents=True)
    (root / ".git").mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n")
    (outside / "AGENTS.md").write_text("outside rules\n")
    (root / "inside.txt").write_text("line one\nline two\nline three\n")
    (root / "crlf.txt").write_bytes(b"first\r\nsecond\r\nno newline at the end")
    (root / "bytes.bin").write_bytes(b"ok \xe2\x82 cut \xff\xfe end\n")
    (root / "AGENTS.md").write_text("root rules\n")
    (root / "pkg" / "AGENTS.md").write_text("pkg rules\n")
    (root / "pkg" / "mod.py").write_text("def needle():\n    return 1\n")
    (root / "pkg" / "deep" / "notes.md").write_text("a needle here\n")
    (root / "pkg" / ".hidden.py").write_text("hidden = True\n")
    (root / ".git" / "HEAD").write_text("ref: refs/heads/corral/test\n")
    (root / ".git" / "AGENTS.md").write_text("git internals\n")
    os.symlink(outside, root / "link-out")
    os.symlink(outside / "secret.txt", root / "secret-link")
    os.symlink(root / "pkg", root / "link-in")
    os.symlink(root / "not-yet" / "dir", root / "dangling")
    return root


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in SECRET_ENV.items():
        monkeypatch.setenv(name, value)
    # rg as the `ripgrep` wheel installs it, for both backends (a pod's tools image has its own).
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    return dict(os.environ)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return build_tree(tmp_path).resolve()


WorkspaceFactory = Callable[[Path], Workspace]


@pytest.fixture(params=["local", "exec"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_workspace(
    tmp_path: Path, secret_env: dict[str, str], backend: str
) -> AsyncIterator[WorkspaceFactory]:
    """Workspaces of the backend the test runs with: in-process, or a real corral-exec."""
    services: list[ExecService] = []
    clients: list[ExecWorkspace] = []

    def make(root: Path) -> Workspace:
        if backend == "local":
            return LocalWorkspace(root)
        socket = tmp_path / f"sock-{len(services)}" / "exec.sock"
        services.append(ExecService(root, socket, secret_env))
        client = ExecWorkspace(socket, root)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
    for service in services:
        service.stop()


@pytest.fixture
def workspace(make_workspace: WorkspaceFactory, tree: Path) -> Workspace:
    return make_workspace(tree)


@pytest.fixture
def tools(workspace: Workspace) -> WorkingTools:
    return WorkingTools(workspace, bash_timeout=5, output_cap=2000)


@pytest.fixture
def reap_pids() -> Iterator[list[int]]:
    """Pids a test saw; any still alive afterwards are killed so a failure leaves nothing."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if not pid_dead(pid):
            os.kill(pid, 9)
