"""The scripted model's prompt cache: the usage the provider reports for repeated prefixes.

The provider caches a request's prefix (its tools, then its system blocks, then its messages'
blocks) up to each block marked `cache_control`, for 5 minutes from its last use. A request pays
`cache_read_input_tokens` for the longest written prefix it starts with (looked for at each
marked block and up to 20 blocks before it), `cache_creation_input_tokens` for what it writes
past that (up to its last marked block), and `input_tokens` for the rest. More than four marked
blocks are refused. Tokens are estimated as the server estimates them, a quarter of the JSON's
length; a prefix is known by a hash of its blocks' canonical JSON without the markers (a marker
that moves on leaves the prefix the same) and of the model.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

MAX_BREAKPOINTS: Final = 4
LOOKBACK_BLOCKS: Final = 20
TTL_SECONDS: Final = 300.0
_PRUNE_AT: Final = 4096  # written prefixes kept before the expired ones are swept


class TooManyBreakpoints(ValueError):
    def __init__(self, found: int) -> None:
        super().__init__(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {found}."
        )


@dataclass(frozen=True)
class PrefixBlock:
    """One block of a request in prefix order: the hash and the length of the prefix it ends."""

    digest: str
    chars: int
    marked: bool

    @property
    def tokens(self) -> int:
        return self.chars // 4


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _unmarked(block: Any) -> tuple[Any, bool]:
    if isinstance(block, dict) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}, True
    return block, False


def _text_blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


def _items(body: dict[str, Any]) -> Iterator[tuple[Any, bool]]:
    """The request's blocks in the order the provider caches them, each with its place."""
    for tool in body.get("tools") or []:
        block, marked = _unmarked(tool)
        yield {"tool": block}, marked
    for raw in _text_blocks(body.get("system")):
        block, marked = _unmarked(raw)
        yield {"system": block}, marked
    for message in body.get("messages") or []:
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        for index, raw in enumerate(_text_blocks(content)):
            block, marked = _unmarked(raw)
            yield {"role": role, "first": index == 0, "block": block}, marked


def prefix_blocks(body: dict[str, Any]) -> list[PrefixBlock]:
    """Every block of the request with the prefix it ends; refused past four markers."""
    running = hashlib.sha256(_canonical(body.get("model")).encode())
    chars = 0
    blocks: list[PrefixBlock] = []
    for item, marked in _items(body):
        text = _canonical(item)
        running.update(text.encode() + b"\x1e")
        chars += len(text)
        blocks.append(PrefixBlock(running.copy().hexdigest(), chars, marked))
    found = sum(b.marked for b in blocks)
    if found > MAX_BREAKPOINTS:
        raise TooManyBreakpoints(found)
    return blocks


class PromptCache:
    """The prefixes requests to one server wrote, and the usage each new request is billed."""

    def __init__(self) -> None:
        self._written: dict[str, float] = {}  # prefix digest -> when it was last written or read
        self._lock = threading.Lock()

    def usage(self, blocks: list[PrefixBlock], now: float | None = None) -> dict[str, int]:
        """The input side of a request's usage; the prefixes it marks are written."""
        now = time.monotonic() if now is None else now
        total = max(1, blocks[-1].tokens) if blocks else 1
        marks = [i for i, block in enumerate(blocks) if block.marked]
        with self._lock:
            hit = self._longest_hit(blocks, marks, now)
            for i in [*marks, *([hit] if hit >= 0 else [])]:
                self._written[blocks[i].digest] = now
            self._prune(now)
        read = blocks[hit].tokens if hit >= 0 else 0
        last = marks[-1] if marks else -1
        written = blocks[last].tokens - read if last > hit else 0
        return {
            "input_tokens": total - read - written,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": written,
        }

    def _longest_hit(self, blocks: list[PrefixBlock], marks: list[int], now: float) -> int:
        """The index of the block ending the longest live written prefix, else -1."""
        best = -1
        for mark in marks:
            for i in range(mark, max(mark - LOOKBACK_BLOCKS, 0) - 1, -1):
                if i <= best:
                    break
                seen = self._written.get(blocks[i].digest)
                if seen is not None and now - seen < TTL_SECONDS:
                    best = i
                    break
        return best

    def _prune(self, now: float) -> None:
        if len(self._written) > _PRUNE_AT:
            self._written = {d: t for d, t in self._written.items() if now - t < TTL_SECONDS}

    def clear(self) -> None:
        with self._lock:
            self._written.clear()
