"""Usage read from answers, the budget, and the custodian's environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral_api.kinds import AgentSpec
from corral_common import toolmatch
from corral_custodian.budget import (
    Budget,
    CallUsage,
    Held,
    StreamUsageReader,
    UsageTotals,
    body_charge,
    budget_refusal,
    lowest,
    remaining,
    reservation_for,
    reservation_refusal,
    stream_charge,
)
from corral_custodian.facts import SessionFacts
from corral_custodian.model_rules import CheckedRequest, ModelRefusal, check_request
from corral_custodian.prices import price_for
from corral_custodian.settings import SettingsError, from_env
from corral_harness.policy import fixed_rule

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
    reader.feed(b"data: not json\n\ndata: [1,2]\n\n: comment\n\n")
    reader.feed(b'data: {"type":"message_delta","usage":{"output_tokens":-5}}\n\n')
    reader.close()
    assert reader.usage.output == 0 and not reader.final


def test_dated_model_ids_take_the_catalog_price_and_unknown_models_cost_nothing() -> None:
    info = price_for("claude-haiku-4-5-20251001")
    assert info is not None and info.input_per_mtok == 1.0
    totals = UsageTotals()
    totals.add(CallUsage(model="mystery-model", input=10, output=10))
    assert totals.cost == 0.0 and totals.unpriced_models == ["mystery-model"]


def test_a_non_streamed_answer_is_charged_its_usage_or_else_the_whole_reservation() -> None:
    ask = CallUsage(model="claude-haiku-4-5", input=300, output=100)
    read = body_charge(
        ask, b'{"model": "claude-haiku-4-5", "usage": {"input_tokens": 3, "output_tokens": 4}}'
    )
    assert read.why == "" and read.call is not None
    assert (read.call.input, read.call.output) == (3, 4)
    for unreadable, why in (
        (b"<html>", "not JSON"),
        (b'{"type": "message"}', "no usage"),
        (b'{"usage": {"input_tokens": 3}}', "no input or output count"),
        (b'{"usage": {"input_tokens": 900, "output_tokens": "many"}}', "no input or output"),
    ):
        charge = body_charge(ask, unreadable)
        assert why in charge.why and "whole reservation" in charge.why
        assert charge.call is not None and charge.call.output == 100
        assert charge.call.input == (900 if b"900" in unreadable else 300)  # more if it said so


def test_budget_refuses_once_spent_and_names_the_budget() -> None:
    totals = UsageTotals()
    assert budget_refusal(totals, Budget(tokens=100)) is None
    totals.add(CallUsage(model="claude-haiku-4-5", input=60, output=40))
    reason = budget_refusal(totals, Budget(tokens=100))
    assert reason is not None and "token budget" in reason and "100 of 100" in reason
    assert budget_refusal(totals, Budget()) is None  # None means no budget
    rich = UsageTotals()
    rich.add(CallUsage(model="claude-opus-4-1", input=0, output=20_000))  # $1.50
    cost_reason = budget_refusal(rich, Budget(cost=1.0))
    assert cost_reason is not None and "cost budget" in cost_reason


def test_tokens_count_cache_writes_but_not_cache_reads_while_cost_prices_both() -> None:
    call = CallUsage(model="claude-haiku-4-5", input=10, output=20, cache_read=1000, cache_write=40)
    assert call.tokens == 70
    assert call.cost() == pytest.approx((10 * 1 + 20 * 5 + 1000 * 0.1 + 40 * 1.25) / 1e6)
    totals = UsageTotals()
    totals.add(call)
    assert totals.tokens == 70
    assert budget_refusal(totals, Budget(tokens=71)) is None


def test_a_reservation_must_fit_beside_spending_requests_in_flight_and_children() -> None:
    ask = reservation_for("claude-haiku-4-5", body_bytes=401, max_tokens=100)
    assert (ask.input, ask.output) == (101, 100)  # ceil(401 / 4) and all of max_tokens
    totals = UsageTotals()
    totals.add(CallUsage(model="claude-haiku-4-5", input=500, output=100))
    budget = Budget(tokens=1000)
    fits = Held(ask.tokens, ask.cost())
    assert reservation_refusal(budget, totals, Held(), Held(), fits) is None
    reason = reservation_refusal(budget, totals, Held(150), Held(50), fits)
    assert reason is not None
    assert "600 of 1000 tokens used, 150 held by requests in flight, 50 given to children" in (
        reason
    )
    assert remaining(budget, totals, Held(150), Held(50)).tokens == 200
    # Cost: $0.001 spent, and this request may cost $0.000601 more, against a $0.0015 cap.
    tight = Budget(cost=0.0015)
    assert "cost budget cannot cover" in str(
        reservation_refusal(tight, totals, Held(), Held(), fits)
    )
    assert lowest(Budget(tokens=5, cost=2.0), Budget(tokens=9), Budget()) == Budget(5, 2.0)


def _read(stream: bytes) -> StreamUsageReader:
    reader = StreamUsageReader(model="claude-haiku-4-5")
    reader.feed(stream)
    reader.close()
    return reader


ASK = CallUsage(model="claude-haiku-4-5", input=2000, output=4000)


def test_a_stream_the_caller_cut_is_charged_for_what_came_through() -> None:
    cut = STREAM.split(b"event: message_delta")[0]
    reader = _read(
        cut + b'event: content_block_delta\ndata: {"type":"content_block_delta",'
        b'"delta":{"type":"text_delta","text":"' + b"y" * 400 + b'"}}\n\n'
    )  # fmt: skip
    charge = stream_charge(reader, ASK, upstream_ended=False)
    assert charge.call is not None and not reader.completed and "caller went away" in charge.why
    assert charge.call.input == 1000
    assert charge.call.output == 101  # ceil((2 + 400) / 4) bytes of text, not message_start's 1
    whole = _read(STREAM)
    assert whole.completed and stream_charge(whole, ASK, upstream_ended=True).call == whole.usage
    # Hung up before the answer began: the provider had the request, its input is charged.
    early = stream_charge(StreamUsageReader(model="m"), ASK, upstream_ended=False)
    assert early.call is not None and (early.call.input, early.call.output) == (2000, 0)


def test_a_stream_that_ended_without_its_usage_is_charged_the_whole_reservation() -> None:
    no_delta = STREAM.replace(b'"usage":{"output_tokens":500}', b'"other":1')
    for stream, why in (
        (b'event: message_stop\ndata: {"type":"message_stop"}\n\n', "reported no usage"),
        (b"", "reported no usage"),
        (no_delta, "without its final usage"),
        (STREAM.split(b"event: message_delta")[0], "without its final usage"),
        (STREAM.split(b"event: message_delta")[0] + b"data: {", "inside an event"),
    ):
        charge = stream_charge(_read(stream), ASK, upstream_ended=True)
        assert why in charge.why and "whole reservation" in charge.why, charge
        assert charge.call is not None
        assert (charge.call.input, charge.call.output) == (2000, 4000)
    # A stream that said it used more than was reserved is charged that.
    big = STREAM.replace(b'"input_tokens":1000', b'"input_tokens":9000').split(
        b"event: message_delta"
    )[0]
    charge = stream_charge(_read(big), ASK, upstream_ended=True)
    assert charge.call is not None and (charge.call.input, charge.call.output) == (9000, 4000)
    # The provider's own error event before anything began: nothing was generated.
    error = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n'
    refused = stream_charge(_read(error), ASK, upstream_ended=True)
    assert refused.call is None and "error event" in refused.why


def facts_with(**agent: object) -> SessionFacts:
    spec = AgentSpec.model_validate({"identity": "x", "model": "claude-haiku-4-5"} | agent)
    return SessionFacts(name="s", namespace="n", uid="u", agent=spec)


def test_the_model_request_rules() -> None:
    f = facts_with(limits={"maxOutputTokens": 2000})
    other = check_request(f, {"model": "claude-opus-4-1", "max_tokens": 1})
    assert isinstance(other, ModelRefusal) and other.status == 403
    assert "'claude-opus-4-1' is not allowed" in other.message
    clamped = check_request(
        f,
        {"model": "claude-haiku-4-5", "max_tokens": 9000,
         "thinking": {"type": "enabled", "budget_tokens": 4096}},
    )  # fmt: skip
    assert isinstance(clamped, CheckedRequest)
    assert clamped.body["max_tokens"] == 2000
    assert clamped.body["thinking"] == {"type": "enabled", "budget_tokens": 1999}
    tiny = check_request(
        facts_with(limits={"maxOutputTokens": 500}),
        {"model": "claude-haiku-4-5", "max_tokens": 900,
         "thinking": {"type": "enabled", "budget_tokens": 1024}},
    )  # fmt: skip
    assert isinstance(tiny, CheckedRequest) and tiny.body["thinking"] == {"type": "disabled"}
    kept = check_request(f, {"model": "claude-haiku-4-5", "max_tokens": 5})
    assert isinstance(kept, CheckedRequest) and kept.body["max_tokens"] == 5
    for bad in ({"max_tokens": True}, {"max_tokens": "9"}, {}):
        refused = check_request(f, {"model": "claude-haiku-4-5", **bad})
        assert isinstance(refused, ModelRefusal) and "max_tokens" in refused.message
    unpriced = facts_with(model="house-model", limits={"budget": {"costUSD": 1}})
    refused = check_request(unpriced, {"model": "house-model", "max_tokens": 5})
    assert isinstance(refused, ModelRefusal) and "no price in the catalog" in refused.message
    assert isinstance(
        check_request(facts_with(model="house-model"), {"model": "house-model", "max_tokens": 5}),
        CheckedRequest,
    )
    server = check_request(
        f, {"model": "claude-haiku-4-5", "max_tokens": 5, "tools": [{"type": "bash_20250124"}]}
    )
    assert isinstance(server, ModelRefusal) and "bash_20250124" in server.message


def test_the_effective_budget_is_the_lowest_of_session_and_agent() -> None:
    f = facts_with(limits={"budget": {"tokens": 800, "costUSD": 5}})
    assert f.budget == Budget(tokens=800, cost=5.0)
    from dataclasses import replace

    assert replace(f, session_budget=Budget(tokens=300)).budget == Budget(tokens=300, cost=5.0)
    assert facts_with().budget == Budget()


def test_toolmatch_is_the_harness_rule() -> None:
    # One fixed rule for both gates: the harness's policy uses the custodian's very function.
    assert fixed_rule.forbidden_reason is toolmatch.forbidden_reason
    # Menu tools match on both forms of their name; deny wins over allow.
    assert toolmatch.refusal("mcp__corral__push", ["push"], []) is None
    assert toolmatch.refusal("mcp__corral__push", ["mcp__corral__*"], []) is None
    assert toolmatch.refusal("mcp__corral__push", ["*"], []) is None
    assert "tools.allow" in str(toolmatch.refusal("mcp__corral__push", ["bash"], []))
    assert "tools.deny" in str(toolmatch.refusal("mcp__corral__push", ["*"], ["push"]))
    assert "fixed rule" in str(toolmatch.refusal("mcp__corral__decide_approval", ["*"], []))


def test_totals_round_trip_through_json() -> None:
    totals = UsageTotals()
    totals.add(CallUsage(model="claude-haiku-4-5", input=5, output=6))
    assert UsageTotals.from_json(totals.to_json()) == totals


def test_settings_from_env(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    spec = tmp_path / "agent.yaml"
    spec.write_text("kind: Agent\nspec:\n  identity: x\n  model: m\n  orchestrator: true\n")
    credential = tmp_path / "credential"
    credential.write_text("pod-local\n")
    s = from_env(
        {
            "CORRAL_CUSTODIAN_ADDR": "127.0.0.5:9000",
            "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential),
            "CORRAL_MODEL_KEY_FILE": str(key_file),
            "CORRAL_BUDGET_TOKENS": "1000",
            "CORRAL_BUDGET_COST": "2.5",
            "CORRAL_AGENT_SPEC_FILE": str(spec),
        }
    )
    assert (s.host, s.port, s.model_key) == ("127.0.0.5", 9000, "sk-from-file")
    assert s.credential == "pod-local" and s.operator_port is None
    assert s.budget == Budget(tokens=1000, cost=2.5)
    assert s.load_agent().orchestrator is True
    assert s.kube is None
    # The file is read afresh: an edited Agent shows on the next call.
    spec.write_text(json.dumps({"identity": "x", "model": "m", "orchestrator": False}))
    assert s.load_agent().orchestrator is False


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({}, "CORRAL_CUSTODIAN_CREDENTIAL_FILE is not set"),
        ({"CORRAL_CUSTODIAN_INSECURE": "1"}, "no Agent"),
        ({"CORRAL_CUSTODIAN_INSECURE": "1", "CORRAL_SESSION_NAME": "../x"}, "object name"),
        ({"CORRAL_CUSTODIAN_INSECURE": "1", "CORRAL_AGENT_NAME": "A/b"}, "Agent name"),
        (
            {"CORRAL_CUSTODIAN_INSECURE": "1", "CORRAL_CUSTODIAN_OPERATOR_ADDR": "1.2.3.4:8082"},
            "CORRAL_WIRE_TOKEN_FILE",
        ),
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
    base = {
        "CORRAL_CUSTODIAN_INSECURE": "1",
        "CORRAL_AGENT_SPEC_JSON": '{"identity":"x","model":"m"}',
    }
    if "CORRAL_CUSTODIAN_INSECURE" in env or not env:
        base = {}  # these cases are about the credential and the Agent themselves
    with pytest.raises(SettingsError, match=fragment):
        from_env(base | env)


def test_a_resumed_sessions_record_starts_from_what_it_had_spent(tmp_path: Path) -> None:
    from corral_custodian._usage_store import UsageStore

    env = {
        "CORRAL_CUSTODIAN_INSECURE": "1",
        "CORRAL_AGENT_SPEC_JSON": '{"identity":"x","model":"m"}',
        "CORRAL_BUDGET_TOKENS": "1000",
        "CORRAL_USAGE_SEED": '{"input": 700, "output": 90, "cacheRead": 5, "cacheWrite": 10, '
        '"cost": 0.25}',
    }
    settings = from_env(env)
    store = UsageStore(None, settings.usage_seed)
    assert (store.totals.tokens, store.totals.cost) == (800, 0.25)
    # 800 of 1,000 spent in the lost pod: the new pod's budget holds at the same cap.
    assert remaining(settings.budget, store.totals, Held(), Held()).tokens == 200
    assert budget_refusal(store.totals, Budget(tokens=800)) is not None  # spent across pods
    kept = UsageStore(tmp_path, settings.usage_seed)
    kept.settle(kept.reserve(CallUsage(model="m")), CallUsage(model="m", input=1))
    # A custodian restarted in the same pod reads its own record, which includes the seed.
    assert UsageStore(tmp_path, None).totals.input == 701
    for bad in ('{"input": -1}', "not json", "[1]"):
        with pytest.raises(SettingsError, match="CORRAL_USAGE_SEED"):
            from_env(env | {"CORRAL_USAGE_SEED": bad})


def test_a_resumed_custodian_counts_what_the_lost_one_gave_its_children(tmp_path: Path) -> None:
    """A child keeps the budget it was carved; the parent's new custodian must not give it out
    again or spend it: it starts with the carve (CORRAL_CARVED_SEED) as well as the usage."""
    from corral_custodian._usage_store import UsageStore

    env = {
        "CORRAL_CUSTODIAN_INSECURE": "1",
        "CORRAL_AGENT_SPEC_JSON": '{"identity":"x","model":"m"}',
        "CORRAL_BUDGET_TOKENS": "1000",
        "CORRAL_USAGE_SEED": '{"input": 300, "output": 0, "cost": 0}',
        "CORRAL_CARVED_SEED": '{"tokens": 500, "cost": 0.5}',
    }
    settings = from_env(env)
    store = UsageStore(None, settings.usage_seed, settings.carved_seed)
    assert (store.carved.tokens, store.carved.cost) == (500, 0.5)
    assert remaining(settings.budget, store.totals, store.reserved, store.carved).tokens == 200
    without = UsageStore(None, settings.usage_seed)  # what it was before: 700 to give again
    assert (
        remaining(settings.budget, without.totals, without.reserved, without.carved).tokens == 700
    )
    # A restarted custodian in the same pod reads its own carve record, which includes the seed.
    kept = UsageStore(tmp_path, settings.usage_seed, settings.carved_seed)
    kept.carve(Held(100, 0.0), "child-b")
    assert UsageStore(tmp_path, None, None).carved.tokens == 600
    for bad in ('{"tokens": -1}', "not json", "[1]"):
        with pytest.raises(SettingsError, match="CORRAL_CARVED_SEED"):
            from_env(env | {"CORRAL_CARVED_SEED": bad})
