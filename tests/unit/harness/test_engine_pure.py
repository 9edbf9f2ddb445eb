"""Pure parts of the engine: provider messages, argument checks, the catalog, the script format."""

from __future__ import annotations

from typing import Any

import pytest

from corral_common.catalog import (
    UnknownModel,
    clamp_output_tokens,
    cost_usd,
    resolve_model,
    thinking_param,
)
from corral_dev.scripted import ScriptError, parse_script
from corral_harness.engine.messages import for_provider
from corral_harness.engine.schema import check_arguments
from corral_harness.engine.seam import DID_NOT_RUN
from corral_harness.tools import SPECS


def _use(uid: str) -> dict[str, object]:
    return {"type": "tool_use", "id": uid, "name": "bash", "input": {}}


def _result(uid: str) -> dict[str, object]:
    return {"type": "tool_result", "tool_use_id": uid, "content": "ok"}


def test_every_tool_use_gets_a_result_and_stray_results_go() -> None:
    transcript: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {"role": "assistant", "content": [_use("a"), _use("b")]},
        {"role": "user", "content": [_result("b"), _result("zzz")], "tool_results": True},
        {"role": "user", "content": [{"type": "text", "text": "next"}]},
        {"role": "assistant", "content": [{"type": "text", "text": ""}, _use("c")]},
    ]
    out = for_provider(transcript)
    assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant", "user"]
    assert out[2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "a",
        "content": DID_NOT_RUN,
        "is_error": True,
    }
    assert out[2]["content"][1] == _result("b")
    assert out[2]["content"][2] == {"type": "text", "text": "next"}
    assert len(out[2]["content"]) == 3  # the stray result for "zzz" is gone
    assert out[3]["content"] == [_use("c")]  # the empty text block is gone
    assert out[4]["content"][0]["tool_use_id"] == "c"
    assert all(set(m) == {"role", "content"} for m in out)


def test_compaction_entries_and_a_leading_assistant_are_not_sent() -> None:
    out = for_provider(
        [
            {"role": "assistant", "content": [{"type": "text", "text": "orphan"}]},
            {"role": "compaction", "summary": "earlier turns"},
            {"role": "user", "content": "plain string"},
        ]
    )
    assert out == [{"role": "user", "content": [{"type": "text", "text": "plain string"}]}]


def test_argument_checks() -> None:
    bash = next(s for s in SPECS if s.name == "bash").input_schema
    assert check_arguments(bash, {"command": "ls"}) is None
    assert "required field 'command'" in (check_arguments(bash, {}) or "")
    assert "unknown field 'x'" in (check_arguments(bash, {"command": "ls", "x": 1}) or "")
    assert "type integer" in (check_arguments(bash, {"command": "ls", "timeout": "5"}) or "")
    assert "type integer" in (check_arguments(bash, {"command": "ls", "timeout": True}) or "")
    assert "at least 1" in (check_arguments(bash, {"command": "ls", "timeout": 0}) or "")
    assert "type object" in (check_arguments(bash, ["ls"]) or "")


def test_catalog_limits_prices_and_thinking() -> None:
    with pytest.raises(UnknownModel, match="known models"):
        resolve_model("gpt-4")
    haiku = resolve_model("claude-3-5-haiku-latest")
    sonnet = resolve_model("claude-sonnet-4-5")
    assert clamp_output_tokens(sonnet, None) == 32000  # the soft cap under the model's 64000
    assert clamp_output_tokens(sonnet, 50000) == 32000  # a call cannot raise it
    assert clamp_output_tokens(haiku, 32000) == 8192  # the model's own maximum
    assert clamp_output_tokens(sonnet, 100) == 100
    assert thinking_param(sonnet, "low", 32000) == {"type": "enabled", "budget_tokens": 1024}
    assert thinking_param(sonnet, "high", 8000) == {"type": "enabled", "budget_tokens": 7999}
    assert thinking_param(haiku, "high", 8192) == {"type": "disabled"}
    assert (
        cost_usd(
            sonnet, input=1_000_000, output=1_000_000, cache_read=1_000_000, cache_write=1_000_000
        )
        == 3 + 15 + 0.3 + 3.75
    )
    assert cost_usd(resolve_model("corral-scripted"), input=9, output=9) == 0


def test_script_format() -> None:
    script = parse_script(
        {
            "default": ["hi"],
            "conversations": {
                "c": [
                    {
                        "thinking": "t",
                        "text": "x",
                        "tool_use": {"name": "bash", "input": {"command": "ls"}},
                        "repeat": 2,
                    },
                    {"fault": {"status": 529}},
                    {"when": {"tool_result_contains": "ok"}, "text": "yes", "otherwise": "no"},
                ]
            },
        }
    )
    replies = script.replies_for("c")
    assert len(replies) == 4
    assert [b["type"] for b in replies[0].content] == ["thinking", "text", "tool_use"]
    assert replies[0].final_stop_reason() == "tool_use"
    assert replies[2].fault is not None and replies[2].fault.status == 529
    assert replies[3].otherwise is not None
    assert script.replies_for("other")[0].content == [{"type": "text", "text": "hi"}]
    bad: dict[str, Any]
    for bad in (
        {"defaults": []},
        {"default": [{"txt": "x"}]},
        {"default": [{"fault": {}}]},
        {"default": [{"content": [{"type": "image"}]}]},
    ):
        with pytest.raises(ScriptError):
            parse_script(bad)
