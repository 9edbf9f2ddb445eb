"""Fitting one generation into the model's window, compacting earlier turns when needed."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .compaction import (
    Message,
    Summarizer,
    active_indices,
    extractive_summary,
    make_compaction_entry,
    turn_starts,
)
from .tokenizer import DEFAULT_TOKENIZER, Tokenizer
from .trimming import truncate_tail

# For a model the catalog does not know: small enough for any model we would run.
CONSERVATIVE_WINDOW = 32_000
# A summary never takes more than this share of the usable budget.
SUMMARY_SHARE = 0.25

WindowLookup = Callable[[str], int | None]


def window_for(model: str, lookup: WindowLookup | None, fallback: int = 0) -> int:
    """The model's registered window, else `fallback` when positive, else the conservative one."""
    size = lookup(model) if lookup is not None else None
    if size is not None and size > 0:
        return size
    return fallback if fallback > 0 else CONSERVATIVE_WINDOW


def usable_budget(window: int, max_output_tokens: int) -> int:
    """Input tokens available: the window minus the room kept for the answer (at most half)."""
    return window - min(max_output_tokens, window // 2)


def count_messages(messages: Sequence[Message], tokenizer: Tokenizer) -> int:
    return sum(tokenizer.count(json.dumps(m.get("content"), ensure_ascii=False)) for m in messages)


@dataclass
class WindowFit:
    messages: list[Message]
    tokens: int
    budget: int
    compaction: Message | None = None
    stop_reason: str | None = None
    notes: list[str] = field(default_factory=list)


async def fit_window(
    transcript: Sequence[Message],
    *,
    fixed_tokens: int,
    budget: int,
    tokenizer: Tokenizer = DEFAULT_TOKENIZER,
    summarizer: Summarizer | None = None,
) -> WindowFit:
    """Messages for the call, compacting at a turn boundary when they would not fit.

    `fixed_tokens` is what the call carries besides messages (system prompt, call-only lines,
    tool definitions). Compaction keeps as many recent turns whole as fit next to a summary of
    the rest; the turn in progress is always kept. If nothing fits, `stop_reason` says why and
    the provider must not be called.
    """
    positions = active_indices(transcript)
    active = [transcript[i] for i in positions]
    total = fixed_tokens + count_messages(active, tokenizer)
    if total <= budget:
        return WindowFit(messages=active, tokens=total, budget=budget)

    room = budget - fixed_tokens
    starts = [s for s in turn_starts(active) if s > 0]  # a cut at 0 would summarize nothing
    summary_cap = max(0, int(room * SUMMARY_SHARE))
    cut: int | None = None
    # Earliest cut first: keep the most recent turns that fit beside a summary.
    for start in starts:
        if count_messages(active[start:], tokenizer) + summary_cap <= room:
            cut = start
            break
    if cut is None:
        kept_tokens = count_messages(active[starts[-1] :], tokenizer) if starts else None
        reason = (
            f"context window exceeded: {total} tokens (estimated) for a budget of {budget}; "
            + (
                "nothing earlier to compact"
                if kept_tokens is None
                else f"the latest turn alone needs {kept_tokens + fixed_tokens}"
            )
            + "; the provider was not called"
        )
        return WindowFit(messages=[], tokens=total, budget=budget, stop_reason=reason)

    summarize = summarizer or extractive_summary
    earlier = active[:cut]
    summary = await summarize(earlier)
    # Leave room for the marker, its metadata and the task layer's compaction note.
    summary, _ = truncate_tail(summary, max(0, summary_cap - 64), tokenizer)
    turns = len(turn_starts(earlier)) or 1
    entry = make_compaction_entry(
        summary, insert_at=positions[cut], turns=turns, kept_from=active[cut]
    )
    messages = [entry, *active[cut:]]
    tokens = fixed_tokens + count_messages(messages, tokenizer)
    if tokens > budget:
        return WindowFit(
            messages=[],
            tokens=tokens,
            budget=budget,
            stop_reason=(
                f"context window exceeded after compaction: {tokens} tokens (estimated) for a "
                f"budget of {budget}; the provider was not called"
            ),
        )
    return WindowFit(messages=messages, tokens=tokens, budget=budget, compaction=entry)
