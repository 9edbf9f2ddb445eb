"""Prompt caching (docs/performance.md, "Prompt caching"): every request of a turn marks its
stable prefixes, so the second and later requests read them from the provider's cache; the
settlement, the receipt and the Session's usage show the cache's reads and writes.

The scripted model bills the cache as the provider does (corral_dev.scripted._cache)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral_api.kinds import Usage
from corral_api.wire import WireUsage
from corral_operator.driver._state import add_usage
from tests._scripted import marked_paths

from ._rig import AGENT, Harness, Model

pytestmark = pytest.mark.timeout(90)

MARK = {"type": "ephemeral"}
TWO_STEPS = [{"tool_use": {"name": "bash", "input": {"command": "echo step"}}}, "done"]


def _turn(harness: Harness, model: Model, conv: str) -> dict[str, Any]:
    """One turn of two requests on a harness of its own, the model's cache empty before it
    (other tests' requests wrote prefixes of the same tool list)."""
    (harness.root / "AGENTS.md").write_text("ROOT-RULE: keep diffs small\n")
    model.scripted.cache.clear()
    model.script(conv, TWO_STEPS)
    harness.start()
    settled = harness.wait_settled(conv, harness.admit(conv, "run a step")["submissionId"])
    assert settled["status"] == "completed", settled
    return settled


def test_the_second_request_reads_identity_instructions_and_tools_from_the_cache(
    fresh_harness: Harness, model: Model, conv: str
) -> None:
    settled = _turn(fresh_harness, model, conv)
    first, second = (r for r in model.scripted.requests if r["conversation"] == conv)
    body = second["body"]
    tools = body["tools"]
    # The tool list: its last tool ends the prefix.
    assert marked_paths(body) == [
        f"tools[{len(tools) - 1}]",
        "system[0]",
        "system[1]",
        f"messages[{len(body['messages']) - 1}].content[0]",
    ]
    assert tools[-1]["cache_control"] == MARK
    # The identity and the instruction files (AGENTS.md, then the Agent's instructions) are
    # blocks of their own, each marked; the rest of the prompt follows unmarked.
    identity, instructions, rest = body["system"]
    assert identity == {
        "type": "text",
        "text": f"<identity>\n{AGENT['identity']}\n</identity>",
        "cache_control": MARK,
    }
    assert instructions["text"].startswith("<instruction_files>")
    assert "ROOT-RULE" in instructions["text"] and AGENT["instructions"] in instructions["text"]
    assert instructions["cache_control"] == MARK
    assert rest["text"].startswith("<project_context>") and "cache_control" not in rest
    # The conversation so far ends at the step's tool result, the next request's prefix.
    assert body["messages"][-1]["content"][0]["type"] == "tool_result"
    # The markers are the request's, never the transcript's.
    assert "cache_control" not in json.dumps(fresh_harness.history(conv))

    # The first request wrote the prefixes; the second read them and wrote only its step.
    assert first["usage"]["cache_read_input_tokens"] == 0
    assert first["usage"]["cache_creation_input_tokens"] > 0
    read = second["usage"]["cache_read_input_tokens"]
    assert read == first["usage"]["cache_creation_input_tokens"]
    assert 0 < second["usage"]["cache_creation_input_tokens"] < read

    # The settlement, the receipt (and the turn's record) and the Session's usage show both.
    usage = settled["usage"]
    assert usage["cacheRead"] == read
    assert usage["cacheWrite"] == sum(
        r["usage"]["cache_creation_input_tokens"] for r in (first, second)
    )
    assert settled["receipt"]["usage"] == usage
    record = fresh_harness.state_dir / "turns" / conv / "turn-1.json"
    assert json.loads(record.read_text())["usage"] == usage
    # `corral run`'s state.json: the driver adds each settlement's usage to status.usage.
    status = add_usage(Usage(), WireUsage.model_validate(usage))
    assert (status.cache_read_tokens, status.cache_write_tokens) == (
        usage["cacheRead"],
        usage["cacheWrite"],
    )


def test_with_breakpoints_off_nothing_is_marked_and_nothing_cached(
    fresh_harness: Harness, model: Model, conv: str
) -> None:
    fresh_harness.extra_env["CORRAL_CACHE_BREAKPOINTS"] = "0"
    settled = _turn(fresh_harness, model, conv)
    requests = [r for r in model.scripted.requests if r["conversation"] == conv]
    assert len(requests) == 2
    assert all(marked_paths(r["body"]) == [] for r in requests)
    assert isinstance(requests[1]["body"]["system"], str)
    assert settled["usage"]["cacheRead"] == settled["usage"]["cacheWrite"] == 0
    assert settled["receipt"]["usage"] == settled["usage"]
