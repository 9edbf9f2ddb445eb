"""The compaction entry: marked, recognized, inserted where it belongs, summarized whole turns."""

from __future__ import annotations

from typing import Any

import pytest

from corral_harness.context import (
    COMPACTION_MARKER,
    active_messages,
    apply_compaction,
    extractive_summary,
    fit_window,
    is_compaction_entry,
    merge_adjacent_roles,
)
from corral_harness.context.compaction import (
    CompactionError,
    compaction_metadata,
    make_compaction_entry,
    turn_starts,
)


def _turn(i: int, size: int = 40) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"ask {i} " + "q" * size},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": f"t{i}", "name": "read", "input": {"path": "a"}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "file body"}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": f"reply {i}"}]},
    ]


def test_turn_boundaries_ignore_tool_results_and_compaction_entries() -> None:
    transcript = [make_compaction_entry("s", insert_at=0, turns=1), *_turn(0), *_turn(1)]
    assert turn_starts(transcript) == [1, 5]


def test_an_entry_is_recognized_by_its_marker_and_carries_metadata() -> None:
    entry = make_compaction_entry("summary text", insert_at=8, turns=2)
    assert is_compaction_entry(entry)
    assert compaction_metadata(entry) == {"insertAt": 8, "summarizedTurns": 2}
    assert not is_compaction_entry({"role": "user", "content": "hello"})
    assert not is_compaction_entry({"role": "assistant", "content": COMPACTION_MARKER + "{}"})
    with pytest.raises(CompactionError, match="unreadable metadata"):
        compaction_metadata({"role": "user", "content": COMPACTION_MARKER + "not json\nx"})


def test_apply_inserts_at_the_boundary_and_the_next_view_starts_there() -> None:
    transcript = [*_turn(0), *_turn(1), *_turn(2)]
    entry = make_compaction_entry("earlier", insert_at=8, turns=2)
    written = apply_compaction(transcript, entry)
    assert written[8] is entry and len(written) == 13
    assert active_messages(written) == [entry, *transcript[8:]]
    with pytest.raises(CompactionError, match="outside the transcript"):
        apply_compaction(transcript, make_compaction_entry("x", insert_at=99, turns=1))


async def test_the_extractive_summary_is_deterministic_and_short() -> None:
    messages = [*_turn(0, size=5000), *_turn(1)]
    first = await extractive_summary(messages)
    assert first == await extractive_summary(messages)
    assert "called read" in first and "reply 1" in first and len(first) <= 4000


def test_merging_keeps_tool_results_first_and_roles_alternating() -> None:
    entry = make_compaction_entry("s", insert_at=0, turns=1)
    merged = merge_adjacent_roles([entry, *_turn(0)])
    assert [m["role"] for m in merged] == ["user", "assistant", "user", "assistant"]
    assert merged[0]["content"][0]["text"].startswith(COMPACTION_MARKER)
    assert merged[0]["content"][1]["text"].startswith("ask 0")


async def test_fit_keeps_recent_turns_whole_and_summarizes_whole_turns() -> None:
    transcript = [*_turn(0, 2000), *_turn(1, 2000), *_turn(2, 2000), *_turn(3, 2000)]
    fit = await fit_window(transcript, fixed_tokens=100, budget=2000)
    assert fit.compaction is not None and fit.stop_reason is None
    kept = fit.messages[1:]
    assert kept[0] is transcript[compaction_metadata(fit.compaction)["insertAt"]]
    assert kept[0]["role"] == "user" and isinstance(kept[0]["content"], str)
    assert fit.tokens <= 2000


async def test_nothing_to_compact_stops() -> None:
    fit = await fit_window(_turn(0, 20_000), fixed_tokens=0, budget=1000)
    assert fit.stop_reason is not None and "provider was not called" in fit.stop_reason


def test_an_appended_entry_finds_its_kept_messages_by_digest() -> None:
    transcript = [*_turn(0), *_turn(1), *_turn(2)]
    entry = make_compaction_entry("s", insert_at=8, turns=2, kept_from=transcript[8])
    appended = [*transcript, entry]
    assert active_messages(appended) == [entry, *transcript[8:]]
    # Positions shifted (an extra message in front): the digest still finds the kept start.
    shifted = [{"role": "user", "content": "preamble"}, *transcript, entry]
    assert active_messages(shifted) == [entry, *transcript[8:]]
    # Inserted at the boundary: the same entry keeps what follows it.
    assert active_messages(apply_compaction(transcript, entry)) == [entry, *transcript[8:]]
