"""The working copy a local run's agent works in, and the branch its commits go on.

With `--workspace DIR` in a git repository, the agent works in a git worktree of that
repository under the run's state directory, on the session's branch (`spec.workspace.branch`,
default `corral/<session>`) made from the current HEAD. A worktree, not the person's own
checkout: their checked-out branch, index and uncommitted files stay exactly as they were
(nothing to stash and restore, nothing lost if the run dies), the agent's tree holds only
committed content, so a turn-end commit holds only what the agent changed, and the branch is
in the person's repository when the run ends. A dirty tree is refused unless the person says
`--allow-dirty` (their uncommitted work is not what the agent sees). When the run ends for
good with the worktree clean, the worktree is removed so the branch can be checked out.
`DIR` outside git is worked in directly: there is nothing to commit to.

Without `--workspace`, like the sandbox's init container: the Session's `workspace.repo` (a
path is read relative to the YAML file that names it) is cloned at `workspace.ref` into the
run's state directory, on the session's branch. A plain directory that is not a git repository
is copied and made one, so the example repository shipped in `examples/` works offline.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from corral_api.kinds import Workspace

_GIT_IDENTITY = ["-c", "user.name=corral", "-c", "user.email=corral@localhost"]
# Our own plumbing in the person's repository runs none of its hooks.
_QUIET = ["-c", "core.hooksPath=/dev/null"]
RECORD = "checkout.json"
DIRTY_SHOWN = 10


class WorkspaceError(Exception):
    pass


def _run_git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *_GIT_IDENTITY, *args], cwd=cwd, capture_output=True, text=True, check=False
    )


def _git(*args: str, cwd: Path | None = None) -> str:
    result = _run_git(*args, cwd=cwd)
    if result.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def init_repository(directory: Path, message: str = "Initial commit") -> None:
    """Make `directory` a git repository with everything in it committed."""
    _git("init", "-q", "-b", "main", cwd=directory)
    _git("add", "-A", cwd=directory)
    _git("commit", "-q", "-m", message, cwd=directory)


@dataclass(frozen=True)
class SessionCheckout:
    """Where the agent works and where its commits go."""

    root: Path  # the granted root
    repository: Path | None = None  # the repository whose branch gets the commits
    branch: str | None = None
    base: str | None = None  # the branch's commit when the session started
    worktree: Path | None = None  # a worktree this run made of the person's repository

    def tip(self) -> str | None:
        if self.repository is None or self.branch is None:
            return None
        found = _run_git("rev-parse", "--verify", "-q", f"refs/heads/{self.branch}^{{commit}}",
                         cwd=self.repository)  # fmt: skip
        return found.stdout.strip() or None

    def committed(self) -> str | None:
        """The branch's commit now, when the session moved it; else None."""
        tip = self.tip()
        return tip if tip is not None and tip != self.base else None

    def release(self) -> bool:
        """Remove the worktree when it is clean, so the person may check the branch out; a
        worktree with uncommitted changes is kept. True when it was removed."""
        if self.worktree is None or self.repository is None or not self.worktree.exists():
            return False
        done = _run_git(*_QUIET, "worktree", "remove", str(self.worktree), cwd=self.repository)
        return done.returncode == 0


def repository_top(directory: Path) -> Path | None:
    """The top of the git working tree `directory` is in, or None outside git."""
    found = _run_git("rev-parse", "--show-toplevel", cwd=directory)
    return Path(found.stdout.strip()).resolve() if found.returncode == 0 else None


def current_branch(top: Path) -> str | None:
    found = _run_git("symbolic-ref", "--short", "-q", "HEAD", cwd=top)
    return found.stdout.strip() or None


def dirty_paths(top: Path) -> list[str]:
    """Tracked changes and untracked files, as `git status --porcelain` lists them."""
    out = _git("status", "--porcelain=v1", "-z", "--untracked-files=normal", cwd=top)
    entries = out.split("\0")
    paths: list[str] = []
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        paths.append(entry[3:])
        if entry[0] in "RC":
            i += 1  # a rename's or copy's source follows
    return paths


def dirty_message(top: Path, paths: list[str]) -> str:
    shown = ", ".join(paths[:DIRTY_SHOWN])
    more = f" and {len(paths) - DIRTY_SHOWN} more" if len(paths) > DIRTY_SHOWN else ""
    return (
        f"--workspace {top} has uncommitted changes or untracked files: {shown}{more}. The "
        "agent works on a new branch made from the last commit and would not see them: "
        "commit or stash them, or pass --allow-dirty to run without them"
    )


def _record(dest: Path) -> Path:
    return dest.parent / RECORD


def worktree_checkout(directory: Path, dest: Path, branch: str) -> SessionCheckout:
    """The agent's worktree of the repository `directory` is in, at `dest`, on `branch` made
    from HEAD; a resumed run (its record beside `dest`) gets its own back."""
    top = repository_top(directory)
    if top is None:
        return SessionCheckout(root=directory)
    below = directory.resolve().relative_to(top)
    record_file = _record(dest)
    if record_file.exists():
        record = json.loads(record_file.read_text())
        if Path(record["repository"]) != top or record["branch"] != branch:
            raise WorkspaceError(
                f"{record_file} is a run of {record['branch']} in {record['repository']}, "
                f"not of {branch} in {top}: use another --state-dir"
            )
        checkout = SessionCheckout(dest / below, top, branch, record["base"], dest)
        if not (dest / ".git").exists():
            # Removed when that run ended; the branch is still there to go on from.
            _git(*_QUIET, "worktree", "prune", cwd=top)
            _git(*_QUIET, "worktree", "add", "-q", str(dest), branch, cwd=top)
        return checkout
    base = _run_git("rev-parse", "--verify", "-q", "HEAD^{commit}", cwd=top).stdout.strip()
    if not base:
        raise WorkspaceError(f"--workspace {top}: the repository has no commit to start from")
    exists = _run_git("rev-parse", "--verify", "-q", f"refs/heads/{branch}", cwd=top)
    if exists.returncode == 0:
        raise WorkspaceError(
            f"spec.workspace.branch: {branch} already exists in {top}; the agent's commits go "
            f"on a new branch made from HEAD: delete it (git branch -D {branch}) or name "
            "another spec.workspace.branch"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    _git(*_QUIET, "worktree", "prune", cwd=top)
    _git(*_QUIET, "worktree", "add", "-q", "-b", branch, str(dest), base, cwd=top)
    checkout = SessionCheckout(dest / below, top, branch, base, dest)
    record = {k: str(v) for k, v in asdict(checkout).items() if k != "root"}
    record_file.write_text(json.dumps(record, indent=2) + "\n")
    if not checkout.root.is_dir():
        raise WorkspaceError(
            f"--workspace {directory}: {below} is not in the repository's last commit"
        )
    return checkout


def prepare_workspace(spec: Workspace, base: Path, dest: Path, branch: str) -> SessionCheckout:
    repo = spec.repo
    local = (base / repo).resolve() if "://" not in repo and not repo.startswith("git@") else None
    if dest.exists() and any(dest.iterdir()):
        # A resumed run keeps its workspace.
        record = _record(dest)
        start = json.loads(record.read_text())["base"] if record.exists() else None
        return SessionCheckout(dest, dest, branch, start)
    if local is not None and not local.exists():
        raise WorkspaceError(f"spec.workspace.repo: {repo!r} does not exist (read as {local})")
    if local is not None and not (local / ".git").exists():
        shutil.copytree(local, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        init_repository(dest, f"Workspace from {repo}")
    else:
        _git("clone", "-q", str(local or repo), str(dest))
        if spec.ref != "HEAD":
            _git("checkout", "-q", spec.ref, cwd=dest)
    _git("checkout", "-q", "-b", branch, cwd=dest)
    start = _git("rev-parse", "HEAD", cwd=dest).strip()
    _record(dest).write_text(json.dumps({"repository": str(dest), "branch": branch,
                                         "base": start}, indent=2) + "\n")  # fmt: skip
    return SessionCheckout(dest, dest, branch, start)
