"""Compaction: earlier turns become one marked transcript entry; recent turns stay whole.

The transcript is a list of Anthropic-format messages. A compaction entry is a user message
whose first block is a text block starting with `COMPACTION_MARKER`, followed by one line of
JSON metadata and then the summary. The metadata names the first message it kept, by position
(`insertAt`) and by a digest of its role and content (`keptFrom`), so the next assembly finds
the kept messages whether the turn inserted the entry there (`apply_compaction`) or appended it
to the end of the transcript. Everything before the kept messages is what the summary replaces.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

Message = dict[str, Any]
Summarizer = Callable[[list[Message]], Awaitable[str]]

COMPACTION_MARKER = "[corral:compaction]"


class CompactionError(ValueError):
    pass


def _first_text(message: Message) -> str | None:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        block = content[0]
        if isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text")
            return text if isinstance(text, str) else None
    return None


def is_compaction_entry(message: Message) -> bool:
    if message.get("role") != "user":
        return False
    text = _first_text(message)
    return text is not None and text.startswith(COMPACTION_MARKER)


def compaction_metadata(message: Message) -> dict[str, Any]:
    text = _first_text(message)
    if text is None or not text.startswith(COMPACTION_MARKER):
        raise CompactionError("not a compaction entry")
    header = text[len(COMPACTION_MARKER) :].split("\n", 1)[0]
    try:
        meta = json.loads(header)
    except json.JSONDecodeError as exc:
        raise CompactionError(f"compaction entry has unreadable metadata: {exc}") from exc
    if not isinstance(meta, dict):
        raise CompactionError("compaction metadata must be a JSON object")
    return meta


def compaction_summary(message: Message) -> str:
    text = _first_text(message) or ""
    return text.split("\n", 1)[1] if "\n" in text else ""


def message_digest(message: Message) -> str:
    canonical = json.dumps(
        {"role": message.get("role"), "content": message.get("content")},
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def make_compaction_entry(
    summary: str, *, insert_at: int, turns: int, kept_from: Message | None = None
) -> Message:
    meta: dict[str, Any] = {"insertAt": insert_at, "summarizedTurns": turns}
    if kept_from is not None:
        meta["keptFrom"] = message_digest(kept_from)
    text = f"{COMPACTION_MARKER}{json.dumps(meta, sort_keys=True)}\n{summary}"
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def last_compaction_index(transcript: Sequence[Message]) -> int | None:
    for i in range(len(transcript) - 1, -1, -1):
        if is_compaction_entry(transcript[i]):
            return i
    return None


def _kept_start(transcript: Sequence[Message], entry_at: int) -> int:
    """Where the messages the entry kept begin: just after it, or earlier when it was appended."""
    try:
        meta = compaction_metadata(transcript[entry_at])
    except CompactionError:
        return entry_at + 1
    digest = meta.get("keptFrom")
    at = meta.get("insertAt")
    after = entry_at + 1
    if digest is None or (after < len(transcript) and message_digest(transcript[after]) == digest):
        return after
    if isinstance(at, int) and 0 <= at < entry_at and message_digest(transcript[at]) == digest:
        return at
    for i in range(entry_at - 1, -1, -1):
        if message_digest(transcript[i]) == digest:
            return i
    return after


def active_indices(transcript: Sequence[Message]) -> list[int]:
    """Positions of the messages the next assembly uses, in the order it uses them."""
    entry_at = last_compaction_index(transcript)
    if entry_at is None:
        return list(range(len(transcript)))
    start = _kept_start(transcript, entry_at)
    rest = [
        i
        for i in range(start, len(transcript))
        if i != entry_at and not is_compaction_entry(transcript[i])
    ]
    return [entry_at, *rest]


def active_messages(transcript: Sequence[Message]) -> list[Message]:
    """The messages the next assembly uses: the latest compaction entry and what it kept."""
    return [transcript[i] for i in active_indices(transcript)]


def apply_compaction(transcript: Sequence[Message], entry: Message) -> list[Message]:
    """The transcript with `entry` inserted where its metadata says (history is kept).

    Appending the entry instead is also understood by the next assembly.
    """
    at = compaction_metadata(entry).get("insertAt")
    if not isinstance(at, int) or not 0 <= at <= len(transcript):
        raise CompactionError(f"compaction insertAt {at!r} is outside the transcript")
    return [*transcript[:at], entry, *transcript[at:]]


def _is_turn_start(message: Message) -> bool:
    """A real user message, not a tool result and not a compaction entry."""
    if message.get("role") != "user" or is_compaction_entry(message):
        return False
    content = message.get("content")
    if isinstance(content, str):
        return True
    if isinstance(content, list):
        kinds = {b.get("type") for b in content if isinstance(b, dict)}
        return "tool_result" not in kinds
    return False


def turn_starts(messages: Sequence[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if _is_turn_start(m)]


def _block_lines(block: Any) -> list[str]:
    if not isinstance(block, dict):
        return []
    kind = block.get("type")
    if kind == "text":
        return [str(block.get("text", ""))]
    if kind == "tool_use":
        return [f"called {block.get('name')} {json.dumps(block.get('input'), sort_keys=True)}"]
    if kind == "tool_result":
        inner = block.get("content")
        if isinstance(inner, list):
            inner = " ".join(str(b.get("text", "")) for b in inner if isinstance(b, dict))
        flag = " (error)" if block.get("is_error") else ""
        return [f"tool result{flag}: {inner}"]
    return []


async def extractive_summary(messages: list[Message], *, max_chars: int = 4000) -> str:
    """A deterministic summary with no model: the first line of every message, in order."""
    lines: list[str] = []
    for message in messages:
        if is_compaction_entry(message):
            lines.append(f"earlier summary: {compaction_summary(message)}")
            continue
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for block in blocks or []:
            for text in _block_lines(block):
                first = text.strip().split("\n", 1)[0][:200]
                if first:
                    lines.append(f"{message.get('role')}: {first}")
    summary = "\n".join(lines)
    return summary if len(summary) <= max_chars else summary[: max_chars - 1] + "…"


def merge_adjacent_roles(messages: Sequence[Message]) -> list[Message]:
    """Join consecutive messages of one role, as the provider expects alternation."""
    merged: list[Message] = []
    for message in messages:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if merged and merged[-1]["role"] == message.get("role"):
            merged[-1]["content"].extend(blocks or [])
        else:
            merged.append({"role": message.get("role"), "content": list(blocks or [])})
    return merged
