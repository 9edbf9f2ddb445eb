"""Work in progress out of one pod and into the next (issue 27): the working tree recorded as a
commit on top of HEAD (the agent's index, HEAD and branches untouched), bundled from the base
the next pod is checked out at, and applied in a fresh checkout there: the changes back,
uncommitted. Real git, through the real `corral-exec` service (a pod; its `/v1/exec/stdin`) and
the in-process workspace of `corral run`."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral_harness import wip
from corral_harness.ports import Workspace
from corral_harness.tools import LocalWorkspace
from corral_harness.tools._exec_client import ExecWorkspace
from tests.unit.tools_exec._service import ExecService

pytestmark = pytest.mark.timeout(60)


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def _repo(root: Path) -> str:
    root.mkdir()
    git(root, "init", "-q", "-b", "corral/s1")
    (root / "README.md").write_text("# repo\n")
    (root / "gone.txt").write_text("to be deleted\n")
    (root / ".gitignore").write_text("*.log\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "start")
    return git(root, "rev-parse", "HEAD")


@pytest.fixture(params=["exec", "local"])
async def pair(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Workspace, Workspace, str]]:
    """The old pod's workspace and the new pod's (a clone checked out at the base), and the
    base."""
    old, new = tmp_path / "old", tmp_path / "new"
    base = _repo(old)
    git(tmp_path, "clone", "-q", str(old), str(new))
    if request.param == "local":
        yield LocalWorkspace(old), LocalWorkspace(new), base
        return
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    services = [ExecService(r, r.parent / f"{r.name}.sock", env) for r in (old, new)]
    clients = [ExecWorkspace(r.parent / f"{r.name}.sock", r) for r in (old, new)]
    try:
        yield clients[0], clients[1], base
    finally:
        for client in clients:
            await client.aclose()
        for service in services:
            service.stop()


async def _bytes(workspace: Workspace, shot: wip.Snapshot) -> bytes:
    return b"".join([chunk async for chunk in wip.bundle(workspace, shot)])


async def test_the_work_in_progress_comes_back_uncommitted_in_a_fresh_checkout(
    pair: tuple[Workspace, Workspace, str],
) -> None:
    old, new, base = pair
    root = old.root
    # The agent mid-turn: one commit of its own, then changed, new, deleted and ignored files,
    # and something staged in its own index.
    (root / "README.md").write_text("# repo\ncommitted by the agent\n")
    git(root, "commit", "-qam", "the agent's own commit")
    (root / "README.md").write_text("# repo\ncommitted by the agent\nand then edited\n")
    (root / "src").mkdir()
    (root / "src" / "new.py").write_text("print('new')\n")
    (root / "gone.txt").unlink()
    (root / "build.log").write_text("ignored\n")
    (root / "staged.txt").write_text("staged\n")
    git(root, "add", "staged.txt")
    head, status = git(root, "rev-parse", "HEAD"), git(root, "status", "--porcelain")

    shot = await wip.snapshot(old, base)
    assert shot is not None and shot.base == base
    data = await _bytes(old, shot)
    # The agent's repository is as it was: HEAD, index, worktree; no ref left behind.
    assert (git(root, "rev-parse", "HEAD"), git(root, "status", "--porcelain")) == (head, status)
    assert wip.WIP_REF not in git(root, "for-each-ref")
    assert not list((root / ".git").glob("corral-wip-index*"))

    await wip.apply(new, data, shot.revision, shot.base)
    there = new.root
    assert git(there, "rev-parse", "HEAD") == base  # HEAD stays at the checkout
    assert (there / "README.md").read_text().endswith("and then edited\n")
    assert (there / "src" / "new.py").read_text() == "print('new')\n"
    assert (there / "staged.txt").exists() and not (there / "gone.txt").exists()
    assert not (there / "build.log").exists()  # ignored files stay out
    listed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=there, capture_output=True, text=True, check=True)  # fmt: skip
    changes = set(listed.stdout.splitlines())  # unstaged: the index is back at HEAD
    assert changes == {" M README.md", " D gone.txt", "?? src/new.py", "?? staged.txt"}


async def test_nothing_beyond_the_base_is_no_snapshot(
    pair: tuple[Workspace, Workspace, str],
) -> None:
    old, _, base = pair
    assert await wip.snapshot(old, base) is None
    (old.root / "build.log").write_text("ignored only\n")
    assert await wip.snapshot(old, base) is None


async def test_a_bundle_whose_base_the_checkout_lacks_is_refused(
    pair: tuple[Workspace, Workspace, str], tmp_path: Path
) -> None:
    old, new, base = pair
    git(old.root, "commit", "-q", "--allow-empty", "-m", "delivered later")
    delivered = git(old.root, "rev-parse", "HEAD")
    (old.root / "more.txt").write_text("more\n")
    shot = await wip.snapshot(old, delivered)
    assert shot is not None
    data = await _bytes(old, shot)
    with pytest.raises(wip.WipError, match="not its base"):
        await wip.apply(new, data, shot.revision, shot.base)  # the checkout is at `base`
    with pytest.raises(wip.WipError, match="not taken"):
        await wip.apply(new, data, shot.revision, None)  # nor has it the bundle's base
    assert git(new.root, "status", "--porcelain") == "" and base
    with pytest.raises(wip.WipError, match="not a full commit id"):
        await wip.apply(new, data, "HEAD", None)


async def test_a_work_in_progress_is_never_laid_over_a_later_checkout(
    pair: tuple[Workspace, Workspace, str],
) -> None:
    """The newest delivery moved past the work in progress's base: the new pod is checked out
    there, and applying the older snapshot would undo the delivered work; it is refused."""
    old, new, base = pair
    (old.root / "early.txt").write_text("early\n")
    shot = await wip.snapshot(old, base)
    assert shot is not None
    data = await _bytes(old, shot)
    (new.root / "delivered.txt").write_text("delivered\n")
    git(new.root, "add", "-A")
    git(new.root, "commit", "-qm", "a later delivery")
    with pytest.raises(wip.WipError, match="not its base"):
        await wip.apply(new, data, shot.revision, shot.base)
    assert (new.root / "delivered.txt").exists() and not (new.root / "early.txt").exists()


async def test_a_configuration_the_agent_planted_is_not_read_while_the_bundle_is_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's HOME holds a .gitconfig naming a required filter, and its work in progress a
    .gitattributes that asks for it: neither the snapshot nor writing the bundle's files in the
    new pod runs (or fails on) the filter: the checkout's hardening reads no global
    configuration."""
    home, marker = tmp_path / "home", tmp_path / "smudged"
    home.mkdir()
    (home / ".gitconfig").write_text(
        f'[filter "mark"]\n\tsmudge = "touch {marker}; cat"\n\trequired = true\n'
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    old, new = tmp_path / "old", tmp_path / "new"
    base = _repo(old)
    git(tmp_path, "clone", "-q", str(old), str(new))
    (old / ".gitattributes").write_text("*.txt filter=mark\n")
    (old / "notes.txt").write_text("planted\n")
    before, after = LocalWorkspace(old), LocalWorkspace(new)
    shot = await wip.snapshot(before, base)
    assert shot is not None
    # Without the hardening the filter would run: git reads that HOME's configuration.
    probe = subprocess.run(["git", "config", "--get", "filter.mark.smudge"], cwd=new,
                           capture_output=True, text=True)  # fmt: skip
    assert str(marker) in probe.stdout
    await wip.apply(after, await _bytes(before, shot), shot.revision, shot.base)
    assert (new / "notes.txt").read_text() == "planted\n"
    assert not marker.exists()
