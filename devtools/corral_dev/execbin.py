"""Corral's Go binaries for tests, the bench and the local node: `corral-exec` (the sandbox's
tools service) and `corral-gateway` (the sandboxes' egress gateway).

`hack/build-exec.sh` and `hack/build-gateway.sh` build each once per source revision into
~/.cache/corral; this runs the script once per process and keeps its answer.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-exec.sh"
GATEWAY_BUILD_SCRIPT = REPO_ROOT / "hack" / "build-gateway.sh"


class ExecBuildError(Exception):
    """A Go binary could not be built."""


def _built(script: Path, name: str) -> Path:
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ExecBuildError(f"building {name} failed:\n{done.stderr[-4000:]}")
    path = Path(done.stdout.strip().splitlines()[-1])
    if not path.is_file():
        raise ExecBuildError(f"hack/{script.name} printed {path}, which is not a file")
    return path


@functools.cache
def exec_binary() -> Path:
    """Build corral-exec if its sources changed, and return the binary's path."""
    return _built(BUILD_SCRIPT, "corral-exec")


@functools.cache
def gateway_binary() -> Path:
    """Build corral-gateway if its sources changed, and return the binary's path."""
    return _built(GATEWAY_BUILD_SCRIPT, "corral-gateway")
