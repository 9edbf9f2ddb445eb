"""The workspace a local run works in, when `--workspace` is not given.

Like the sandbox's init container: the Session's `workspace.repo` (a path is read relative to the
YAML file that names it) is cloned at `workspace.ref` into the run's state directory, on the
branch `corral/<session>`. A plain directory that is not a git repository is copied and made
one, so the example repository shipped in `examples/` works offline.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from corral_api.kinds import Workspace

_GIT_IDENTITY = ["-c", "user.name=corral", "-c", "user.email=corral@localhost"]


class WorkspaceError(Exception):
    pass


def _git(*args: str, cwd: Path | None = None) -> str:
    result = subprocess.run(
        ["git", *_GIT_IDENTITY, *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def init_repository(directory: Path, message: str = "Initial commit") -> None:
    """Make `directory` a git repository with everything in it committed."""
    _git("init", "-q", "-b", "main", cwd=directory)
    _git("add", "-A", cwd=directory)
    _git("commit", "-q", "-m", message, cwd=directory)


def prepare_workspace(spec: Workspace, base: Path, dest: Path, session_name: str) -> Path:
    repo = spec.repo
    local = (base / repo).resolve() if "://" not in repo and not repo.startswith("git@") else None
    if dest.exists() and any(dest.iterdir()):
        return dest  # a resumed run keeps its workspace
    if local is not None and not local.exists():
        raise WorkspaceError(f"spec.workspace.repo: {repo!r} does not exist (read as {local})")
    if local is not None and not (local / ".git").exists():
        shutil.copytree(local, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        init_repository(dest, f"Workspace from {repo}")
    else:
        _git("clone", "-q", str(local or repo), str(dest))
        if spec.ref != "HEAD":
            _git("checkout", "-q", spec.ref, cwd=dest)
    _git("checkout", "-q", "-b", spec.branch or f"corral/{session_name}", cwd=dest)
    return dest
