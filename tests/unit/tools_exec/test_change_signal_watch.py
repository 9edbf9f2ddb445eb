"""The change signal with the tree's inotify watch: no scan when nothing a survey reads moved,
and every change that matters still seen by the next request.

Both backends (in-process, and the real corral-exec) for what the policy sees; the in-process
workspace also counts its scans, so a command that touches nothing a survey reads is shown to
cost none, and a tree it cannot watch (more directories than the bound) to scan every time.
"""

from __future__ import annotations

import asyncio
import gc
import os
import weakref
from pathlib import Path

import pytest

from corral_harness.ports import Workspace
from corral_harness.tools import LocalWorkspace, _treewatch

from .test_change_signal import Steps, _age, texts

pytestmark = pytest.mark.timeout(60)


def _scans(workspace: Workspace) -> int | None:
    if not isinstance(workspace, LocalWorkspace):
        return None
    # Without a watch every check scans: say why rather than miscount.
    assert workspace._watch is not None, "no inotify instance (the user's 128 all taken?)"
    return workspace.scans


async def _settled(steps: Steps) -> None:
    """Steps until the watch holds every directory: a scan that added a watch is followed by
    one more (the directory may have changed between its listing and its watch)."""
    for _ in range(3):
        await steps.bash("true")


async def test_a_command_that_only_reads_costs_no_scan(workspace: Workspace, tree: Path) -> None:
    _age(tree)
    steps = Steps(workspace, tree)
    first = await steps.policy.workspace_facts()
    await _settled(steps)
    scans, surveys = _scans(workspace), len(steps.surveys)
    for command in (
        "cat AGENTS.md pkg/AGENTS.md > /dev/null",
        "ls -laR . > /dev/null; grep -rn needle . > /dev/null; find . -name AGENTS.md",
        "stat pkg/deep pkg/AGENTS.md > /dev/null; cat .git/HEAD",
        # Files a survey never reads, written, made and removed.
        "echo y > pkg/mod.py; echo z > pkg/deep/new.txt; rm pkg/deep/new.txt",
    ):
        facts = await steps.bash(command)
        assert facts.instruction_files == first.instruction_files
        assert facts.entries == first.entries and facts.branch == first.branch
    assert len(steps.surveys) == surveys
    assert _scans(workspace) == scans  # the watch answered, the tree was not walked


async def test_a_deep_instruction_file_created_edited_and_deleted(
    workspace: Workspace, tree: Path
) -> None:
    _age(tree)
    steps = Steps(workspace, tree)
    await steps.policy.workspace_facts()
    await _settled(steps)
    facts = await steps.bash("echo 'deep rules' > pkg/deep/AGENTS.md")
    assert texts(facts)["pkg/deep/AGENTS.md"] == "deep rules\n"
    facts = await steps.bash("echo 'DEEP RULES' > pkg/deep/AGENTS.md")  # same size, same tick
    assert texts(facts)["pkg/deep/AGENTS.md"] == "DEEP RULES\n"
    facts = await steps.bash("printf 'appended\\n' >> pkg/deep/AGENTS.md")
    assert texts(facts)["pkg/deep/AGENTS.md"] == "DEEP RULES\nappended\n"
    # Made one level deeper in a directory that did not exist, in one command.
    facts = await steps.bash(
        "mkdir -p pkg/deep/er/est && echo 'deepest' > pkg/deep/er/est/AGENTS.md"
    )
    assert texts(facts)["pkg/deep/er/est/AGENTS.md"] == "deepest\n"
    await _settled(steps)
    facts = await steps.bash("echo 'deepest, edited' > pkg/deep/er/est/AGENTS.md")
    assert texts(facts)["pkg/deep/er/est/AGENTS.md"] == "deepest, edited\n"
    facts = await steps.bash("rm pkg/deep/AGENTS.md pkg/deep/er/est/AGENTS.md")
    assert list(texts(facts)) == ["AGENTS.md", "pkg/AGENTS.md"]


async def test_renames_of_files_and_directories_are_seen(workspace: Workspace, tree: Path) -> None:
    _age(tree)
    steps = Steps(workspace, tree)
    await steps.policy.workspace_facts()
    await _settled(steps)
    # A file renamed to the name, and the name renamed away.
    facts = await steps.bash("mv pkg/deep/notes.md pkg/deep/AGENTS.md")
    assert texts(facts)["pkg/deep/AGENTS.md"] == "a needle here\n"
    facts = await steps.bash("mv pkg/AGENTS.md pkg/OLD-AGENTS.md")
    assert list(texts(facts)) == ["AGENTS.md", "pkg/deep/AGENTS.md"]
    # A directory renamed: its files move with it, and it is still watched under its new name.
    facts = await steps.bash("mv pkg/deep pkg/moved")
    assert list(texts(facts)) == ["AGENTS.md", "pkg/moved/AGENTS.md"]
    await _settled(steps)
    facts = await steps.bash("echo 'edited after the move' > pkg/moved/AGENTS.md")
    assert texts(facts)["pkg/moved/AGENTS.md"] == "edited after the move\n"
    # A file renamed over the root's AGENTS.md.
    facts = await steps.bash("echo 'replacement' > r.tmp && mv r.tmp AGENTS.md")
    assert texts(facts)["AGENTS.md"] == "replacement\n"


async def test_a_directory_moved_out_of_the_tree_and_made_again_is_watched_anew(
    workspace: Workspace, tree: Path
) -> None:
    """The old directory's watch goes with it out of the tree; the one made at its path must be
    watched, or a file made there later would go unseen."""
    _age(tree)
    steps = Steps(workspace, tree)
    await steps.policy.workspace_facts()
    await _settled(steps)
    facts = await steps.bash("mv pkg ../pkg-moved-away && mkdir -p pkg/deep")
    assert list(texts(facts)) == ["AGENTS.md"]
    await _settled(steps)
    facts = await steps.bash("echo 'in the new pkg' > pkg/deep/AGENTS.md")
    assert texts(facts)["pkg/deep/AGENTS.md"] == "in the new pkg\n"
    # The directory that left is no longer the tree's: what happens to it changes nothing.
    (tree.parent / "pkg-moved-away" / "AGENTS.md").write_text("outside now\n")
    facts = await steps.bash("true")
    assert list(texts(facts)) == ["AGENTS.md", "pkg/deep/AGENTS.md"]


async def test_changes_made_between_commands_are_seen_at_the_next(
    workspace: Workspace, tree: Path
) -> None:
    """A person's edit, or a command's background child still writing: no command made them,
    and the next command's signal reports them."""
    _age(tree)
    steps = Steps(workspace, tree)
    await steps.policy.workspace_facts()
    await _settled(steps)
    (tree / "pkg" / "AGENTS.md").write_text("edited by a person\n")
    facts = await steps.bash("true")
    assert texts(facts)["pkg/AGENTS.md"] == "edited by a person\n"
    await steps.bash("(sleep 0.3; echo 'from the background' > pkg/deep/AGENTS.md) &")
    written = tree / "pkg" / "deep" / "AGENTS.md"
    for _ in range(200):
        if written.exists() and written.read_text():
            break
        await asyncio.sleep(0.02)
    facts = await steps.bash("true")
    assert texts(facts)["pkg/deep/AGENTS.md"] == "from the background\n"


async def test_lost_events_make_the_next_check_scan(tree: Path) -> None:
    """More events than the kernel queues (16,384 by default): the overflow marker alone says
    that an AGENTS.md may have changed among them."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    _age(tree)
    workspace = LocalWorkspace(tree)
    steps = Steps(workspace, tree)
    await steps.policy.workspace_facts()
    await _settled(steps)
    scans = workspace.scans
    # Each append is an IN_MODIFY the kernel cannot merge with the one before (they alternate).
    command = (
        f"for i in $(seq {limit // 2 + 10}); do echo a >> pkg/a.log; echo b >> pkg/b.log; done;"
        " echo 'after the flood' > pkg/deep/AGENTS.md"
    )
    facts = await steps.bash(command)
    assert texts(facts)["pkg/deep/AGENTS.md"] == "after the flood\n"
    assert workspace.scans > scans


async def test_a_tree_too_large_to_watch_is_scanned_after_every_command(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_treewatch, "MAX_WATCHED_DIRS", 2)  # the tree has 3 directories
    _age(tree)
    workspace = LocalWorkspace(tree)
    steps = Steps(workspace, tree)
    first = await steps.policy.workspace_facts()
    await _settled(steps)
    scans = workspace.scans
    for _ in range(3):
        facts = await steps.bash("true")
        assert facts.instruction_files == first.instruction_files
    assert workspace.scans == scans + 3
    facts = await steps.bash("echo 'still seen' > pkg/deep/AGENTS.md")
    assert texts(facts)["pkg/deep/AGENTS.md"] == "still seen\n"


async def test_the_watch_goes_with_its_workspace(tree: Path) -> None:
    """An inotify instance is one of the user's 128: a workspace dropped closes its own."""
    workspace = LocalWorkspace(tree)
    await workspace.survey("AGENTS.md", {}, 4096)
    watch = workspace._watch
    assert watch is not None
    fd, gone = watch._fd, weakref.ref(watch)
    assert os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    del workspace, watch
    gc.collect()
    assert gone() is None
    with pytest.raises(OSError):
        os.fstat(fd)  # nothing in this test opens another fd meanwhile
