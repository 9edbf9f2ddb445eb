"""The `local_node` fixture: the local node as a real process against the `control_plane`.

Registered in conftest.py with `from ._node_fixtures import *`. Session-scoped: one node serves
every test (pods live in each test's own namespace). The node's pod directories are under
`local_node.workdir / "pods"`, one per pod, with `logs/<container>.log` inside.

The node runs as root (as the tests do), so each container runs as its own uid in its own mount
namespace, where /root is hidden: the test repositories (`TEST_REPOS`, which `git_repo` fills)
are shared with every container read-only, as a git server would serve them.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral_dev import controlplane, stack
from corral_dev._node_host import SHARE_ENV

__all__ = ["TEST_REPOS", "LocalNodeHandle", "local_node"]

# Outside /tmp and shared with the node's containers (see _operator_fixtures.git_repo).
TEST_REPOS = Path.home() / ".cache" / "corral" / "test-repos"


@dataclass
class LocalNodeHandle:
    name: str
    workdir: Path
    process: subprocess.Popen[bytes]
    log: Path

    def pod_dir(self, namespace: str, pod: str) -> Path:
        found = list((self.workdir / "pods").glob(f"{namespace}_{pod}_*"))
        if not found:
            raise FileNotFoundError(f"no local pod directory for {namespace}/{pod}")
        return max(found, key=lambda p: p.stat().st_mtime)  # the newest pod of that name


@pytest.fixture(scope="package")
def local_node(control_plane: controlplane.ControlPlane) -> Iterator[LocalNodeHandle]:
    workdir = Path(tempfile.mkdtemp(prefix="corral-node-"))
    name = "corral-local-node"
    log = workdir / "node.log"
    TEST_REPOS.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SHARE_ENV, str(TEST_REPOS))  # for the node process only
        process = stack.start_local_node(control_plane.kubeconfig, workdir, name, log)
    handle = LocalNodeHandle(name, workdir, process, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            done = control_plane.kubectl(
                "get", "node", name, "-o", "jsonpath={.status.conditions[0].status}", check=False
            )
            if done.stdout.strip() == "True":
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the local node did not come up:\n{log.read_text()}")
            time.sleep(0.1)
        yield handle
    finally:
        # A test may have restarted the node (tests/attack/test_checkout_rerun.py): stop the
        # process that runs now, so the pods it runs go with it.
        process = handle.process
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
