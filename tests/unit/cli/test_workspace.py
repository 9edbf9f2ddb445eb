"""The local run's working copy: a worktree of the person's repository on the session branch."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from corral_cli._workspace import (
    WorkspaceError,
    dirty_message,
    dirty_paths,
    repository_top,
    worktree_checkout,
)


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "svc" / "api").mkdir(parents=True)
    (repo / "svc" / "api" / "main.py").write_text("print(1)\n")
    (repo / "old name.txt").write_text("x\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    return repo


def test_dirty_paths_lists_changes_untracked_files_and_renames(repo: Path) -> None:
    assert dirty_paths(repo) == []
    (repo / "svc" / "api" / "main.py").write_text("print(2)\n")
    (repo / "new file.txt").write_text("y\n")
    _git(repo, "mv", "old name.txt", "renamed.txt")
    assert sorted(dirty_paths(repo)) == ["new file.txt", "renamed.txt", "svc/api/main.py"]
    message = dirty_message(repo, [f"f{i}" for i in range(13)])
    assert "f0, f1" in message and "f9 and 3 more" in message and "f10" not in message


def test_the_worktree_is_on_the_session_branch_and_leaves_the_checkout_alone(
    repo: Path, tmp_path: Path
) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "svc" / "api" / "main.py").write_text("the person's edit\n")
    dest = tmp_path / "state" / "workspace"
    checkout = worktree_checkout(repo / "svc" / "api", dest, "corral/s1")
    # The granted root is the same directory in the worktree; the person's edit is not there.
    assert checkout.root == dest / "svc" / "api"
    assert (checkout.root / "main.py").read_text() == "print(1)\n"
    assert (checkout.repository, checkout.branch, checkout.base) == (repo, "corral/s1", head)
    assert _git(dest, "branch", "--show-current") == "corral/s1"
    assert _git(repo, "branch", "--show-current") == "main"
    assert (repo / "svc" / "api" / "main.py").read_text() == "the person's edit\n"
    assert checkout.committed() is None
    # A commit in the worktree is on the branch, in the person's repository.
    (checkout.root / "main.py").write_text("print(3)\n")
    _git(dest, "commit", "-qam", "agent")
    tip = _git(repo, "rev-parse", "corral/s1")
    assert checkout.committed() == tip
    # A resumed run gets the same worktree and base; once released, it is made again.
    again = worktree_checkout(repo / "svc" / "api", dest, "corral/s1")
    assert again == checkout
    assert checkout.release() and not dest.exists()
    resumed = worktree_checkout(repo / "svc" / "api", dest, "corral/s1")
    assert resumed.base == head and _git(dest, "rev-parse", "HEAD") == tip


def test_an_existing_branch_and_an_empty_repository_are_refused(repo: Path, tmp_path: Path) -> None:
    _git(repo, "branch", "corral/taken")
    with pytest.raises(WorkspaceError, match=r"corral/taken already exists in .*git branch -D"):
        worktree_checkout(repo, tmp_path / "a" / "workspace", "corral/taken")
    empty = tmp_path / "empty"
    empty.mkdir()
    _git(empty, "init", "-q", "-b", "main")
    with pytest.raises(WorkspaceError, match="has no commit to start from"):
        worktree_checkout(empty, tmp_path / "b" / "workspace", "corral/s1")


def test_a_directory_outside_git_is_worked_in_directly(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert repository_top(plain) is None
    checkout = worktree_checkout(plain, tmp_path / "state" / "workspace", "corral/s1")
    assert checkout.root == plain and checkout.branch is None and checkout.committed() is None
