"""Recall before each generation: call-only lines, never the transcript, and fail-open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral_harness.memory import MemoryStore, latest_user_text
from corral_harness.policy.turn_policy import CorralTurnPolicy

from ..policy._helpers import ctx


def _transcript() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Tell me about the old task."},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": [{"type": "text", "text": "Now update the billing service."}]},
    ]


def test_latest_user_text_skips_tool_results() -> None:
    transcript = [
        *_transcript(),
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "read", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]},
    ]
    assert latest_user_text(transcript) == "Now update the billing service."


async def test_recalled_lines_go_on_the_call_only(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m.db", scope="s1")
    store.add("billing service", "Billing deploys need the finance team's sign-off.")
    store.add("old task", "Irrelevant to the latest message.")
    policy = CorralTurnPolicy(granted_root=tmp_path, memory=store)
    transcript = _transcript()
    before = repr(transcript)
    plan = await policy.prepare_request(ctx(tmp_path), transcript)
    assert plan.call_only_lines == [
        "[memory #1 via subject; origin unknown] billing service: "
        "Billing deploys need the finance team's sign-off."
    ]
    assert "finance" not in repr(plan.messages) and "finance" not in plan.system
    assert repr(transcript) == before


async def test_a_memory_failure_makes_the_turn_worse_not_stopped(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m.db", scope="s1")
    store.add("billing service", "A fact.")
    store.close()  # every query now raises sqlite3.ProgrammingError
    policy = CorralTurnPolicy(granted_root=tmp_path, memory=store)
    plan = await policy.prepare_request(ctx(tmp_path), _transcript())
    assert plan.stop_reason is None and plan.messages and plan.call_only_lines == []


async def test_the_scope_comes_from_the_caller(tmp_path: Path) -> None:
    stores = {
        "conv-a": MemoryStore(tmp_path / "m.db", scope="a"),
        "conv-b": MemoryStore(tmp_path / "m.db", scope="b"),
    }
    stores["conv-a"].add("billing service", "Only conversation A knows this.")
    policy = CorralTurnPolicy(granted_root=tmp_path, memory=lambda c: stores[c.conversation])
    plan_a = await policy.prepare_request(ctx(tmp_path, conversation="conv-a"), _transcript())
    plan_b = await policy.prepare_request(ctx(tmp_path, conversation="conv-b"), _transcript())
    assert len(plan_a.call_only_lines) == 1 and plan_b.call_only_lines == []


async def test_the_turn_context_scope_picks_the_store(tmp_path: Path) -> None:
    from dataclasses import replace

    from corral_harness.policy.turn_policy import memory_per_scope

    MemoryStore(tmp_path / "m.db", scope="team-a").add("billing service", "Team A's fact.")
    policy = CorralTurnPolicy(granted_root=tmp_path, memory=memory_per_scope(tmp_path / "m.db"))
    scoped = replace(ctx(tmp_path), memory_scope="team-a")
    other = replace(ctx(tmp_path, conversation="c2"), memory_scope="team-b")
    unscoped = ctx(tmp_path, conversation="c3")
    assert len((await policy.prepare_request(scoped, _transcript())).call_only_lines) == 1
    assert (await policy.prepare_request(other, _transcript())).call_only_lines == []
    assert (await policy.prepare_request(unscoped, _transcript())).call_only_lines == []


async def test_a_custodian_that_is_down_leaves_the_turn_going(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Recall and extraction through the custodian are fail-open: nothing listens on the port,
    the call goes on without memory, the accepted turn stands, and both faults are logged."""
    import socket

    from corral_api.kinds import AgentSpec
    from corral_harness.custodian_client.memory import CustodianMemory

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens
    remote = CustodianMemory(f"http://127.0.0.1:{port}", timeout=2, credential="x" * 32)
    policy = CorralTurnPolicy(granted_root=tmp_path, memory=remote.for_turn)
    spec = AgentSpec.model_validate(
        {"identity": "t", "model": "m", "memory": {"extractAfterTurn": True}}
    )
    with caplog.at_level("ERROR"):
        plan = await policy.prepare_request(ctx(tmp_path, spec), _transcript())
        verdict = await policy.after_turn(ctx(tmp_path, spec), "Remember: a: b")
    assert plan.stop_reason is None and plan.messages and plan.call_only_lines == []
    assert verdict.accept
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "memory recall failed" in logged and "memory extraction failed" in logged
    # An Agent without memory costs no round trip at all.
    assert remote.for_turn(ctx(tmp_path)) is None
    await remote.close()
