"""Collecting the five layers' contents from the Agent, the workspace and the transcript.

This is the I/O side (it reads the tree); `assemble` stays pure. The turn policy and
`corral context` both call `collect_layers`, so the command shows what the turn would send.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corral_api.kinds import AgentSpec

from .assembly import Unit
from .compaction import Message, active_messages, is_compaction_entry, turn_starts
from .instructions import InstructionFileCache, instruction_units
from .layers import LayerName

MAX_LISTED_ENTRIES = 200


def _git_branch(root: Path) -> str | None:
    try:
        head = (root / ".git" / "HEAD").read_text().strip()
    except OSError:
        return None
    return head.removeprefix("ref: refs/heads/") if head.startswith("ref: ") else head[:12]


def project_units(root: Path) -> list[Unit]:
    """Where the agent works: the root, its branch, and the top-level entries."""
    lines = [f"Workspace (granted root): {root}"]
    branch = _git_branch(root)
    if branch:
        lines.append(f"Git branch: {branch}")
    try:
        entries = sorted(
            (e.name + ("/" if e.is_dir(follow_symlinks=False) else ""))
            for e in os.scandir(root)
            if e.name != ".git"
        )
    except OSError:
        entries = []
    if entries:
        shown = entries[:MAX_LISTED_ENTRIES]
        more = len(entries) - len(shown)
        lines.append(
            "Top-level entries: " + ", ".join(shown) + (f" (+{more} more)" if more else "")
        )
    return [Unit(source="workspace", text="\n".join(lines))]


def rule_units(root: Path, *, read_only: bool, extra: Sequence[str] = ()) -> list[Unit]:
    """The rules the harness enforces, stated for the model; oldest (most general) first."""
    rules = [
        Unit("granted-root", f"Files and commands stay inside {root}; paths outside are refused."),
        Unit(
            "human-gate",
            "Merging, rebasing, landing and cluster apply/patch/delete wait for a human.",
        ),
        Unit(
            "tool-search",
            "Each tool shows one line; call tool_search for a tool's full instructions.",
        ),
    ]
    if read_only:
        rules.append(
            Unit(
                "read-only",
                "This session is read-only: writing files and running commands are refused.",
            )
        )
    rules.extend(Unit(f"rule-{i + 1}", text) for i, text in enumerate(extra))
    return rules


def _text_of(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def task_units(transcript: Sequence[Message]) -> list[Unit]:
    """The task: the conversation's first request, kept even after compaction summarizes it.

    It is in every call (not only after compaction) so the system prompt, and the window
    accounting, stay the same before and after a compaction.
    """
    units: list[Unit] = []
    starts = turn_starts(transcript)
    if starts:
        units.append(Unit("task", _text_of(transcript[starts[0]])))
    active = active_messages(transcript)
    if active and is_compaction_entry(active[0]):
        units.append(Unit("state", "Earlier turns are summarized in the first message."))
    return units


def collect_layers(
    agent: AgentSpec,
    root: Path,
    cache: InstructionFileCache,
    transcript: Sequence[dict[str, Any]],
    *,
    read_only: bool,
    extra_rules: Sequence[str] = (),
) -> dict[LayerName, list[Unit]]:
    return {
        LayerName.IDENTITY: [Unit("agent:identity", agent.identity, header=False)],
        LayerName.INSTRUCTION_FILES: instruction_units(cache.load(root), agent.instructions),
        LayerName.PROJECT_CONTEXT: project_units(root),
        LayerName.BUSINESS_RULES: rule_units(root, read_only=read_only, extra=extra_rules),
        LayerName.TASK_STATE: task_units(transcript),
    }
