"""The window each call gets: layers, the model's size, compaction, and the stop."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from corral_harness.context import (
    COMPACTION_MARKER,
    CONSERVATIVE_WINDOW,
    apply_compaction,
    is_compaction_entry,
)
from corral_harness.policy.turn_policy import CorralTurnPolicy
from corral_harness.ports import ToolCall

from ._helpers import WORKING, agent, ctx


def _turns(n: int, size: int) -> list[dict[str, Any]]:
    transcript: list[dict[str, Any]] = []
    for i in range(n):
        transcript.append({"role": "user", "content": f"request {i}: " + "u" * size})
        transcript.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{i}", "name": "read", "input": {}}],
            }
        )
        transcript.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok"}],
            }
        )
        transcript.append({"role": "assistant", "content": f"answer {i}"})
    return transcript


async def test_the_system_prompt_carries_the_layers_in_order(tmp_path: Path) -> None:
    (tmp_path / "AGENTS.md").write_text("Run make test before answering.")
    policy = CorralTurnPolicy(granted_root=tmp_path)
    spec = agent(instructions="Prefer small commits.")
    plan = await policy.prepare_request(ctx(tmp_path, spec), _turns(1, 10))
    system = plan.system
    assert (
        system.index("<identity>")
        < system.index("Run make test")
        < system.index("Prefer small commits.")
    )
    assert f"Workspace (granted root): {tmp_path.resolve()}" in system
    assert set(plan.layer_tokens) >= {"identity", "instruction_files", "task_state", "messages"}


async def test_an_agents_md_written_by_a_tool_is_seen_next_call(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    c = ctx(tmp_path)
    first = await policy.prepare_request(c, _turns(1, 10))
    assert "Never touch vendor/" not in first.system
    (tmp_path / "AGENTS.md").write_text("Never touch vendor/.")
    stale = await policy.prepare_request(c, _turns(1, 10))
    assert "Never touch vendor/" not in stale.system  # cached until told
    await policy.after_tool(c, ToolCall("t", "write", {"path": "AGENTS.md"}), "ok", False)
    fresh = await policy.prepare_request(c, _turns(1, 10))
    assert "Never touch vendor/" in fresh.system
    # A shell command may have created one anywhere: bash invalidates the whole root.
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "AGENTS.md").write_text("sub rules")
    await policy.after_tool(c, ToolCall("t", "bash", {"command": "mkdir sub"}), "", False)
    assert "sub rules" in (await policy.prepare_request(c, _turns(1, 10))).system


async def test_an_unknown_model_gets_the_conservative_window(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path, window_lookup=lambda m: None)
    big = _turns(1, CONSERVATIVE_WINDOW * 4)  # alone larger than the conservative window
    plan = await policy.prepare_request(ctx(tmp_path, window=0, model="mystery"), big)
    assert plan.stop_reason is not None and "provider was not called" in plan.stop_reason
    known = CorralTurnPolicy(granted_root=tmp_path, window_lookup=lambda m: 1_000_000)
    plan = await known.prepare_request(ctx(tmp_path, window=0, model="mystery"), big)
    assert plan.stop_reason is None and plan.messages


async def test_earlier_turns_compact_into_one_marked_entry(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    transcript = _turns(6, 16_000)
    c = ctx(tmp_path, window=14_000, max_output=2_000)
    plan = await policy.prepare_request(c, transcript)
    assert plan.stop_reason is None and plan.compaction is not None
    assert is_compaction_entry(plan.compaction)
    first_text = plan.messages[0]["content"][0]["text"]
    assert first_text.startswith(COMPACTION_MARKER)
    # Recent turns stay whole; earlier ones survive only as the summary's short lines.
    sent = repr(plan.messages)
    assert transcript[-4]["content"] in sent and "answer 5" in sent
    assert transcript[-8]["content"] not in sent
    # Messages alternate roles as the provider requires.
    roles = [m["role"] for m in plan.messages]
    assert all(a != b for a, b in itertools.pairwise(roles))
    # The turn writes the entry back; the next assembly starts from it and does not compact again.
    written = apply_compaction(transcript, plan.compaction)
    again = await policy.prepare_request(c, written)
    assert again.compaction is None and again.stop_reason is None
    assert again.messages[0]["content"][0]["text"] == first_text
    assert "Earlier turns are summarized" in again.system
    assert "request 0" in again.system  # the original task stays in the window


async def test_a_custom_summarizer_is_used(tmp_path: Path) -> None:
    seen: list[int] = []

    async def summarize(messages: list[dict[str, Any]]) -> str:
        seen.append(len(messages))
        return "SUMMARY FROM MODEL"

    policy = CorralTurnPolicy(granted_root=tmp_path, summarizer=summarize)
    plan = await policy.prepare_request(
        ctx(tmp_path, window=14_000, max_output=2_000), _turns(6, 16_000)
    )
    assert seen and seen[0] % 4 == 0  # whole turns only
    assert plan.compaction is not None and "SUMMARY FROM MODEL" in repr(plan.compaction)


async def test_still_too_big_after_compaction_stops_without_calling(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    transcript = _turns(3, 60_000)  # the latest turn alone exceeds the window
    plan = await policy.prepare_request(ctx(tmp_path, window=12_000, max_output=2_000), transcript)
    assert plan.stop_reason is not None and "latest turn alone" in plan.stop_reason
    assert plan.messages == [] and plan.compaction is None


async def test_tools_count_against_the_window(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    c = ctx(tmp_path, window=8_000, max_output=1_000)
    ok = await policy.prepare_request(c, _turns(1, 10))
    policy.visible_tools(c, WORKING)
    with_tools = await policy.prepare_request(c, _turns(1, 10))
    assert ok.stop_reason is None and with_tools.stop_reason is None
    assert with_tools.layer_tokens["messages"] == ok.layer_tokens["messages"]


async def test_a_compacted_transcript_compacts_again_over_its_own_summary(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    c = ctx(tmp_path, window=14_000, max_output=2_000)
    transcript = _turns(6, 16_000)
    first = await policy.prepare_request(c, transcript)
    assert first.compaction is not None
    written = apply_compaction(transcript, first.compaction)
    written += _turns(2, 16_000)  # two more long turns arrive
    second = await policy.prepare_request(c, written)
    assert second.compaction is not None and second.stop_reason is None
    text = second.compaction["content"][0]["text"]
    assert "earlier summary:" in text  # the old summary is folded into the new one
    rewritten = apply_compaction(written, second.compaction)
    third = await policy.prepare_request(c, rewritten)
    assert third.compaction is None and third.stop_reason is None


async def test_turn_records_beyond_the_last_20_are_pruned_after_a_turn(tmp_path: Path) -> None:
    records = tmp_path / "state" / "conv-1"
    records.mkdir(parents=True)
    for n in range(1, 31):
        (records / f"turn-{n}.json").write_text("{}")
    policy = CorralTurnPolicy(
        granted_root=tmp_path, turn_records_dir=lambda c: tmp_path / "state" / c.conversation
    )
    assert (await policy.after_turn(ctx(tmp_path), "done")).accept
    assert sorted(int(p.stem.split("-")[1]) for p in records.iterdir()) == list(range(11, 31))


async def test_a_long_summary_is_cut_to_fit(tmp_path: Path) -> None:
    async def verbose(messages: list[dict[str, Any]]) -> str:
        return "summary " * 200_000

    policy = CorralTurnPolicy(granted_root=tmp_path, summarizer=verbose)
    plan = await policy.prepare_request(
        ctx(tmp_path, window=14_000, max_output=2_000), _turns(6, 16_000)
    )
    assert plan.stop_reason is None and plan.compaction is not None
    assert "[… truncated …]" in plan.compaction["content"][0]["text"]
    assert sum(plan.layer_tokens.values()) <= 12_000


async def test_an_appended_compaction_entry_is_understood_too(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    c = ctx(tmp_path, window=14_000, max_output=2_000)
    transcript = _turns(6, 16_000)
    plan = await policy.prepare_request(c, transcript)
    assert plan.compaction is not None
    # The turn appends the entry where it stands, then the model's answer follows.
    appended = [
        *transcript,
        {"role": "compaction", **plan.compaction},
        {"role": "assistant", "content": "next answer"},
    ]
    again = await policy.prepare_request(c, appended)
    assert again.compaction is None and again.stop_reason is None
    expected = [
        *plan.messages[:-1],
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "answer 5"},
                {"type": "text", "text": "next answer"},
            ],
        },
    ]
    assert again.messages == expected
