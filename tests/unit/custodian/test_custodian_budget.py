"""Usage read from answers, the budget, and the custodian's environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral_custodian.budget import (
    Budget,
    CallUsage,
    StreamUsageReader,
    UsageTotals,
    budget_refusal,
    usage_of_body,
)
from corral_custodian.prices import price_for
from corral_custodian.settings import SettingsError, from_env

STREAM = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"model":"claude-haiku-4-5","usage":'
    b'{"input_tokens":1000,"output_tokens":1,"cache_read_input_tokens":200,'
    b'"cache_creation_input_tokens":40}}}\n\n'
    b"event: ping\ndata: {}\n\n"
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"hi"}}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":500}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


@pytest.mark.parametrize("chunk_size", [1, 7, 64, len(STREAM)])
def test_stream_usage_survives_any_chunking(chunk_size: int) -> None:
    reader = StreamUsageReader(model="from-request")
    for i in range(0, len(STREAM), chunk_size):
        reader.feed(STREAM[i : i + chunk_size])
    reader.close()
    u = reader.usage
    assert (u.model, u.input, u.output, u.cache_read, u.cache_write) == (
        "claude-haiku-4-5",
        1000,
        500,  # message_delta's cumulative count replaces message_start's
        200,
        40,
    )
    # haiku-4-5: $1 in, $5 out, cache read 0.1x, cache write 1.25x, per million tokens.
    assert u.cost() == pytest.approx((1000 * 1 + 500 * 5 + 200 * 0.1 + 40 * 1.25) / 1e6)


def test_garbage_in_a_stream_is_ignored_not_fatal() -> None:
    reader = StreamUsageReader(model="m")
    reader.feed(b"data: not json\ndata: [1,2]\n: comment\n")
    reader.feed(b'data: {"type":"message_delta","usage":{"output_tokens":-5}}\n')
    reader.close()
    assert reader.usage.output == 0


def test_dated_model_ids_take_the_catalog_price_and_unknown_models_cost_nothing() -> None:
    info = price_for("claude-haiku-4-5-20251001")
    assert info is not None and info.input_per_mtok == 1.0
    totals = UsageTotals()
    totals.add(CallUsage(model="mystery-model", input=10, output=10))
    assert totals.cost == 0.0 and totals.unpriced_models == ["mystery-model"]


def test_non_streamed_usage() -> None:
    call = usage_of_body("x", {"model": "claude-haiku-4-5", "usage": {"input_tokens": 3}})
    assert call is not None and call.input == 3
    assert usage_of_body("x", {"type": "error"}) is None


def test_budget_refuses_once_spent_and_names_the_budget() -> None:
    totals = UsageTotals()
    assert budget_refusal(totals, Budget(tokens=100)) is None
    totals.add(CallUsage(model="claude-haiku-4-5", input=60, output=40))
    reason = budget_refusal(totals, Budget(tokens=100))
    assert reason is not None and "token budget" in reason and "100 of 100" in reason
    assert budget_refusal(totals, Budget()) is None  # 0 means no budget
    rich = UsageTotals()
    rich.add(CallUsage(model="claude-opus-4-1", input=0, output=20_000))  # $1.50
    cost_reason = budget_refusal(rich, Budget(cost=1.0))
    assert cost_reason is not None and "cost budget" in cost_reason


def test_totals_round_trip_through_json() -> None:
    totals = UsageTotals()
    totals.add(CallUsage(model="claude-haiku-4-5", input=5, output=6))
    assert UsageTotals.from_json(totals.to_json()) == totals


def test_settings_from_env(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    spec = tmp_path / "agent.yaml"
    spec.write_text("kind: Agent\nspec:\n  identity: x\n  model: m\n  orchestrator: true\n")
    s = from_env(
        {
            "CORRAL_CUSTODIAN_ADDR": "127.0.0.5:9000",
            "CORRAL_MODEL_KEY_FILE": str(key_file),
            "CORRAL_BUDGET_TOKENS": "1000",
            "CORRAL_BUDGET_COST": "2.5",
            "CORRAL_AGENT_SPEC_FILE": str(spec),
        }
    )
    assert (s.host, s.port, s.model_key) == ("127.0.0.5", 9000, "sk-from-file")
    assert s.budget == Budget(tokens=1000, cost=2.5)
    assert s.load_agent().orchestrator is True
    assert s.kube is None
    # The file is read afresh: an edited Agent shows on the next call.
    spec.write_text(json.dumps({"identity": "x", "model": "m", "orchestrator": False}))
    assert s.load_agent().orchestrator is False


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"CORRAL_CUSTODIAN_ADDR": "nope"}, "host:port"),
        ({"CORRAL_BUDGET_TOKENS": "lots"}, "CORRAL_BUDGET_TOKENS"),
        ({"CORRAL_BUDGET_COST": "-1"}, "negative"),
        ({"CORRAL_KUBE_API": "https://x"}, "CORRAL_KUBE_TOKEN_FILE"),
        (
            {"CORRAL_KUBE_API": "https://x", "CORRAL_KUBE_TOKEN_FILE": "/t"},
            "CORRAL_SESSION_UID",
        ),
        ({"CORRAL_AGENT_SPEC_JSON": '{"identity": "x"}'}, "not a valid Agent spec"),
        ({"CORRAL_AGENT_SPEC_JSON": "[1]"}, "object"),
    ],
)
def test_bad_environment_is_refused_with_a_reason(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment):
        from_env(env)
