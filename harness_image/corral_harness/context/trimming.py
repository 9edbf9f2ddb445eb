"""The three trimming strategies. Each is deterministic and never exceeds its budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from .tokenizer import Tokenizer

TRUNCATION_MARKER = "\n[… truncated …]"

U = TypeVar("U")


def drop_whole_units(
    units: Sequence[U],
    budget: int,
    tokenizer: Tokenizer,
    render: Callable[[Sequence[U]], str],
) -> tuple[list[U], list[U]]:
    """Keep a suffix of `units` whose rendering fits; never split a unit.

    Units arrive in discard order (least important first). A unit that alone exceeds the
    budget can never fit, so it goes first wherever it stands; then units leave from the head.
    """
    dropped_idx: set[int] = set()
    for i, unit in enumerate(units):
        if tokenizer.count(render([unit])) > budget:
            dropped_idx.add(i)
    remaining = [i for i in range(len(units)) if i not in dropped_idx]
    start = 0
    while start < len(remaining):
        if tokenizer.count(render([units[i] for i in remaining[start:]])) <= budget:
            break
        dropped_idx.add(remaining[start])
        start += 1
    kept = [units[i] for i in remaining[start:]]
    dropped = [units[i] for i in range(len(units)) if i in dropped_idx]
    return kept, dropped


def truncate_tail(text: str, budget: int, tokenizer: Tokenizer) -> tuple[str, bool]:
    """The longest prefix that fits with the marker appended; (text, truncated?).

    Python strings are code points, so a prefix never splits a UTF-8 sequence. When not even
    the marker fits, the result is empty.
    """
    if tokenizer.count(text) <= budget:
        return text, False
    if tokenizer.count(TRUNCATION_MARKER) > budget:
        return "", True
    lo, hi = 0, len(text)  # invariant: prefix of length lo fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tokenizer.count(text[:mid] + TRUNCATION_MARKER) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo] + TRUNCATION_MARKER, True


def keep_or_drop(text: str, budget: int, tokenizer: Tokenizer) -> str:
    """All or nothing."""
    return text if tokenizer.count(text) <= budget else ""
