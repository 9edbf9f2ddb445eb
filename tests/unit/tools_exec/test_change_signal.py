"""After a command, the instruction files are revalidated by the workspace's change signal.

Both backends (in-process, and the real corral-exec): the policy runs `bash` the way a turn
does (tool, then `after_tool`, then the next request's `workspace_facts`). A command that
changes nothing costs no survey at all; one that creates, edits or deletes an AGENTS.md
anywhere (a new directory too), adds a top-level entry or switches the branch is seen by the
very next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from corral_harness.policy.turn_policy import CorralTurnPolicy, WorkspaceFacts
from corral_harness.ports import Survey, ToolCall, Workspace
from corral_harness.tools import WorkingTools

from ..policy._helpers import WORKING, agent, ctx

pytestmark = pytest.mark.timeout(60)


def _age(root: Path, seconds: float = 600) -> None:
    """Every file and directory untouched for a while: a checkout from long ago."""
    old = time.time() - seconds
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            os.utime(path, (old, old))


class Steps:
    """The policy and the tools over one workspace, with the surveys it asks for counted."""

    def __init__(self, workspace: Workspace, tree: Path) -> None:
        self.policy = CorralTurnPolicy(workspace=workspace)
        self.tools = WorkingTools(workspace, bash_timeout=10, output_cap=4000)
        self.ctx = ctx(tree, agent(allow=["*"]))
        self.policy.visible_tools(self.ctx, WORKING)
        self.surveys: list[Survey] = []
        survey: Callable[..., Awaitable[Survey]] = workspace.survey

        async def counted(*args: Any, **kwargs: Any) -> Survey:
            answer = await survey(*args, **kwargs)
            self.surveys.append(answer)
            return answer

        workspace.survey = counted  # type: ignore[method-assign]

    async def bash(self, command: str) -> WorkspaceFacts:
        """One step: the command, the policy told of it, the next request's facts."""
        call = ToolCall("t", "bash", {"command": command})
        result = await self.tools.run("bash", call.input)
        assert not result.is_error, result.content
        await self.policy.after_tool(self.ctx, call, result.content, result.is_error)
        return await self.policy.workspace_facts()


def texts(facts: WorkspaceFacts) -> dict[str, str]:
    return {f.relpath: f.text for f in facts.instruction_files}


async def test_a_command_that_changes_nothing_costs_no_survey(
    workspace: Workspace, tree: Path
) -> None:
    _age(tree)
    steps = Steps(workspace, tree)
    first = await steps.policy.workspace_facts()
    assert list(texts(first)) == ["AGENTS.md", "pkg/AGENTS.md"]
    assert len(steps.surveys) == 1
    for _ in range(5):
        facts = await steps.bash("echo step; echo data > pkg/mod.py; touch -d @1 pkg/mod.py")
        assert facts.instruction_files == first.instruction_files
        assert facts.entries == first.entries and facts.branch == first.branch
    assert len(steps.surveys) == 1  # no round trip at all after these commands
    # A new turn surveys again, and an unchanged tree is answered without any file.
    steps.policy.cache.invalidate(workspace.root)
    again = await steps.policy.workspace_facts()
    assert steps.surveys[-1].unchanged and steps.surveys[-1].files == []
    assert again.instruction_files == first.instruction_files
    assert steps.policy.cache.confirmations == 1


async def test_every_change_a_command_makes_is_seen_by_the_next_request(
    workspace: Workspace, tree: Path
) -> None:
    _age(tree)
    steps = Steps(workspace, tree)
    assert (await steps.policy.workspace_facts()).branch == "corral/test"
    # Created in directories that did not exist, in the same clock tick as the scans.
    facts = await steps.bash("mkdir -p new/a/b && echo 'deep rules' > new/a/b/AGENTS.md")
    assert texts(facts)["new/a/b/AGENTS.md"] == "deep rules\n"
    assert "new/" in facts.entries
    # Rewritten in place with the same size, at once and again a moment later.
    facts = await steps.bash("echo 'PKG RULES' > pkg/AGENTS.md")
    assert texts(facts)["pkg/AGENTS.md"] == "PKG RULES\n"
    facts = await steps.bash("echo 'PKG rules' > pkg/AGENTS.md")
    assert texts(facts)["pkg/AGENTS.md"] == "PKG rules\n"
    # Edited with its old mtime put back (a size change still shows).
    facts = await steps.bash("echo 'root rules, longer' > AGENTS.md; touch -d @1 AGENTS.md")
    assert texts(facts)["AGENTS.md"] == "root rules, longer\n"
    # Deleted, and a whole directory of them moved.
    facts = await steps.bash("rm pkg/AGENTS.md && mv new renamed")
    assert list(texts(facts)) == ["AGENTS.md", "renamed/a/b/AGENTS.md"]
    assert "renamed/" in facts.entries and "new/" not in facts.entries
    # The branch.
    facts = await steps.bash("echo 'ref: refs/heads/corral/other' > .git/HEAD")
    assert facts.branch == "corral/other"
    # And after all that, an unchanged step is still answered from the cache.
    _age(tree)
    await steps.bash("true")  # the first scan of the aged tree: a new generation
    surveyed = len(steps.surveys)
    facts = await steps.bash("true")
    assert len(steps.surveys) == surveyed
    assert list(texts(facts)) == ["AGENTS.md", "renamed/a/b/AGENTS.md"]


async def test_a_cancelled_command_leaves_no_signal(workspace: Workspace, tree: Path) -> None:
    """A command cut off before its end says nothing of what it changed: the next request
    surveys, and sees the change."""
    _age(tree)
    steps = Steps(workspace, tree)
    await steps.policy.workspace_facts()
    await steps.bash("true")
    assert workspace.survey_generation("AGENTS.md") is not None
    command = "echo x > AGENTS.md; touch -d @1 AGENTS.md; touch written; sleep 30"
    task = asyncio.create_task(steps.tools.run("bash", {"command": command, "timeout": 60}))
    deadline = time.monotonic() + 10
    while not (tree / "written").exists():
        assert time.monotonic() < deadline and not task.done(), "the command did not start"
        await asyncio.sleep(0.02)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert workspace.survey_generation("AGENTS.md") is None
    surveyed = len(steps.surveys)
    call = ToolCall("t", "bash", {"command": command})
    await steps.policy.after_tool(steps.ctx, call, "cancelled", True)
    facts = await steps.policy.workspace_facts()
    assert len(steps.surveys) == surveyed + 1
    assert texts(facts)["AGENTS.md"] == "x\n"


async def test_a_timed_out_command_reports_what_it_left(workspace: Workspace, tree: Path) -> None:
    _age(tree)
    steps = Steps(workspace, tree)
    await steps.policy.workspace_facts()
    command = "echo 'new rules' > pkg/deep/AGENTS.md; sleep 30"
    call = ToolCall("t", "bash", {"command": command, "timeout": 1})
    result = await steps.tools.run("bash", call.input)
    assert "timed out" in result.content
    await steps.policy.after_tool(steps.ctx, call, result.content, result.is_error)
    facts = await steps.policy.workspace_facts()
    assert texts(facts)["pkg/deep/AGENTS.md"] == "new rules\n"
