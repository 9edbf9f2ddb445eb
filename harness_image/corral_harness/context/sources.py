"""Collecting the five layers' contents from the Agent, the workspace and the transcript.

Pure: what the workspace holds arrives as facts read through the workspace port, so the turn
policy and `corral context` build the same layers from the same facts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .assembly import Unit
from .compaction import Message, active_messages, is_compaction_entry, turn_starts

MAX_LISTED_ENTRIES = 200


def project_units(root: Path, branch: str | None, entries: Sequence[str]) -> list[Unit]:
    """Where the agent works: the root, its branch, and the top-level entries (read through
    the workspace port by the caller, so this stays pure)."""
    lines = [f"Workspace (granted root): {root}"]
    if branch:
        lines.append(f"Git branch: {branch}")
    if entries:
        shown = list(entries[:MAX_LISTED_ENTRIES])
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
