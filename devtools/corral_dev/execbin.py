"""The `corral-exec` binary (the sandbox's tools service) for tests, the bench and the local node.

`hack/build-exec.sh` builds it once per source revision into ~/.cache/corral/exec; this runs
the script once per process and keeps its answer.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-exec.sh"


class ExecBuildError(Exception):
    """corral-exec could not be built."""


@functools.cache
def exec_binary() -> Path:
    """Build corral-exec if its sources changed, and return the binary's path."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ExecBuildError(f"building corral-exec failed:\n{done.stderr[-4000:]}")
    path = Path(done.stdout.strip().splitlines()[-1])
    if not path.is_file():
        raise ExecBuildError(f"hack/build-exec.sh printed {path}, which is not a file")
    return path
