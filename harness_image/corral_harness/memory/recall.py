"""The recall and after-turn extraction hooks, and turn-record pruning.

Recall runs before each generation: it searches memory with the latest user message and adds
the hits as call-only lines (never transcript). After an accepted turn, a source that extracts
(the custodian's) is handed the final answer. Any failure is logged and the turn goes on: a
memory fault makes the turn worse, never stops it.

A source is a local `MemoryStore` (tests, a harness without a custodian) or anything with the
`RemoteSource` methods (the custodian's client).
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from corral_common.memory import MemoryStore

from ..hooks import HookEvent, HookResult, add_lines

log = logging.getLogger(__name__)

KEEP_TURNS = 20
TURN_RECORD = re.compile(r"^turn-(\d+)(?:\.[\w.-]+)?$")


def latest_user_text(messages: Sequence[dict[str, Any]]) -> str:
    """Text of the latest user message that has text (tool results alone do not count)."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str) and content.strip():
            return content
        if isinstance(content, list):
            texts = [
                str(b.get("text", ""))
                for b in content
                if isinstance(b, dict) and b.get("type") == "text"
            ]
            joined = "\n".join(t for t in texts if t.strip())
            if joined:
                return joined
    return ""


class RemoteSource(Protocol):
    """Memory kept elsewhere (the custodian): recall lines, and extraction after a turn."""

    async def recall_lines(self, query: str, limit: int) -> list[str]: ...

    async def extract(self, final_text: str, submission_id: str) -> None: ...


MemorySource = MemoryStore | RemoteSource


async def recall_lines(
    source: MemorySource, messages: Sequence[dict[str, Any]], limit: int = 5
) -> list[str]:
    query = latest_user_text(messages)
    if not query:
        return []
    if isinstance(source, MemoryStore):
        return [hit.line() for hit in source.recall(query, limit=limit)]
    return await source.recall_lines(query, limit)


def recall_hook(
    source_for: Callable[[HookEvent], MemorySource | None], *, limit: int = 5
) -> Callable[[HookEvent], Any]:
    """A before_generation handler; `source_for` picks the memory for the event's session."""

    async def recall(event: HookEvent) -> HookResult | None:
        try:
            source = source_for(event)
            if source is None:
                return None
            lines = await recall_lines(source, event.messages, limit)
        except Exception:
            log.exception("memory recall failed; continuing without memory")
            return None
        return add_lines(*lines) if lines else None

    recall.__qualname__ = "memory_recall"
    return recall


async def extract_after_turn(source: MemorySource | None, final_text: str, submission: str) -> None:
    """After an accepted turn: hand the final answer to a source that extracts facts from it
    (the custodian decides whether the Agent wants that). Fail-open: logged, never raised."""
    if source is None or isinstance(source, MemoryStore) or not final_text.strip():
        return
    try:
        await source.extract(final_text, submission)
    except Exception:
        log.exception("memory extraction failed; the turn stands")


def prune_turn_records(directory: str | Path, keep: int = KEEP_TURNS) -> list[Path]:
    """Remove turn records older than the newest `keep`.

    Layout: one entry per turn directly in `directory`, named `turn-<N>` with an optional
    extension (`turn-7.json`, `turn-000012/`); N is the turn number, larger is newer. Other
    names are left alone. Returns what was removed.
    """
    if keep < 0:
        raise ValueError("keep must be >= 0")
    root = Path(directory)
    if not root.is_dir():
        return []
    numbered: list[tuple[int, Path]] = []
    for entry in root.iterdir():
        match = TURN_RECORD.match(entry.name)
        if match:
            numbered.append((int(match.group(1)), entry))
    kept_turns = set(sorted({n for n, _ in numbered})[-keep:]) if keep else set()
    removed: list[Path] = []
    for number, entry in sorted(numbered, key=lambda item: (item[0], item[1].name)):
        if number in kept_turns:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed.append(entry)
    return removed
