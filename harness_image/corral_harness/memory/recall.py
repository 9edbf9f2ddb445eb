"""The recall hook and turn-record pruning.

Recall runs before each generation: it searches the store with the latest user message and adds
the hits as call-only lines (never transcript). Any failure is logged and the call goes on
without memory: a memory fault makes the turn worse, never stops it.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..hooks import HookEvent, HookResult, add_lines
from .store import MemoryStore

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


def recall_lines(
    store: MemoryStore, messages: Sequence[dict[str, Any]], limit: int = 5
) -> list[str]:
    query = latest_user_text(messages)
    if not query:
        return []
    return [hit.line() for hit in store.recall(query, limit=limit)]


def recall_hook(
    store_for: Callable[[HookEvent], MemoryStore | None], *, limit: int = 5
) -> Callable[[HookEvent], HookResult | None]:
    """A before_generation handler; `store_for` picks the store for the event's scope."""

    def recall(event: HookEvent) -> HookResult | None:
        try:
            store = store_for(event)
            if store is None:
                return None
            lines = recall_lines(store, event.messages, limit)
        except Exception:
            log.exception("memory recall failed; continuing without memory")
            return None
        return add_lines(*lines) if lines else None

    recall.__qualname__ = "memory_recall"
    return recall


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
