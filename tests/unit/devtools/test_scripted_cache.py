"""The scripted model's prompt cache: requests that repeat a marked prefix are billed for it as
the provider bills them, cache reads for the longest prefix written before, cache writes for
what a request marks past it, input for the rest."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from corral_dev.scripted._cache import PromptCache, prefix_blocks
from tests._scripted import ScriptedServer

pytestmark = pytest.mark.timeout(30)

MARK = {"type": "ephemeral"}
TOOLS = [
    {"name": "bash", "description": "Run a command", "input_schema": {"type": "object"}},
    {"name": "read", "description": "Read a file", "input_schema": {"type": "object"}},
]
IDENTITY = "<identity>\nYou are careful.\n</identity>"
REST = "<task_state>\n[task]\nfix the build\n</task_state>"


def _body(messages: list[dict[str, Any]], *, marked: bool = True, identity: str = IDENTITY) -> Any:
    """A request as the harness sends one: the last tool, the identity and the last block of
    the conversation marked (or nothing, `marked=False`)."""
    mark = {"cache_control": MARK} if marked else {}
    tools = [*TOOLS[:-1], {**TOOLS[-1], **mark}]
    system = [{"type": "text", "text": identity, **mark}, {"type": "text", "text": REST}]
    if marked:
        last = messages[-1]
        messages = [*messages[:-1], {**last, "content": [*last["content"][:-1],
                                                         {**last["content"][-1], **mark}]}]
    return {"model": "claude-sonnet-4-5", "max_tokens": 100, "tools": tools, "system": system,
            "messages": messages, "metadata": {"user_id": "cache"}}  # fmt: skip


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


STEP_1 = [_user("fix the build")]
STEP_2 = [
    *STEP_1,
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash",
                                       "input": {"command": "make"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
]  # fmt: skip


def _ask(scripted: ScriptedServer, body: Any) -> dict[str, int]:
    answer = httpx.post(f"{scripted.url}/v1/messages", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    usage: dict[str, int] = answer.json()["usage"]
    return usage


def _tokens(body: Any, through: int) -> int:
    """The estimate of the prefix through block `through` (negative: from the end)."""
    return prefix_blocks(body)[through].tokens


def test_the_second_request_reads_the_prefix_the_first_wrote(scripted: ScriptedServer) -> None:
    first, second = _body(STEP_1), _body(STEP_2)
    one = _ask(scripted, first)
    whole_first = _tokens(first, -1)
    assert one == {
        "input_tokens": 0,  # everything up to the last block was marked, so written
        "output_tokens": one["output_tokens"],
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": whole_first,
    }
    two = _ask(scripted, second)
    # The step's request finds the first one's prefix (its marker has moved on, the prefix is
    # the same): it reads that, and writes only what the step added.
    assert two["cache_read_input_tokens"] == whole_first > 0
    assert two["cache_creation_input_tokens"] == _tokens(second, -1) - whole_first > 0
    assert two["input_tokens"] == 0
    # Each request's record carries what it was billed.
    assert [r["usage"] for r in scripted.requests("cache")] == [one, two]


def test_the_longest_written_prefix_is_read_and_the_rest_is_input(
    scripted: ScriptedServer,
) -> None:
    _ask(scripted, _body(STEP_1))
    # Another identity: the tool list (marked, written by the first) is all that still matches;
    # the new prefix through the conversation's marker is written, nothing after it is input.
    other = _body(STEP_1, identity="<identity>\nYou are hasty.\n</identity>")
    usage = _ask(scripted, other)
    tools = _tokens(other, len(TOOLS) - 1)
    assert usage["cache_read_input_tokens"] == tools
    assert usage["cache_creation_input_tokens"] == _tokens(other, -1) - tools
    # The same request unmarked: no cache read or written, the whole prompt is input, and the
    # same total (a marker is not part of the prompt).
    assert usage["input_tokens"] == 0
    plain = _ask(scripted, _body(STEP_1, marked=False))
    assert plain["cache_read_input_tokens"] == plain["cache_creation_input_tokens"] == 0
    assert plain["input_tokens"] == _tokens(_body(STEP_1), -1)


def test_more_than_four_markers_are_refused_as_the_provider_refuses_them(
    scripted: ScriptedServer,
) -> None:
    body = _body(STEP_2)
    for block in (body["system"][1], body["messages"][0]["content"][0]):
        block["cache_control"] = MARK
    answer = httpx.post(f"{scripted.url}/v1/messages", json=body, timeout=10)
    assert answer.status_code == 400
    assert "A maximum of 4 blocks with cache_control" in answer.json()["error"]["message"]


def test_a_scripted_input_side_replaces_the_estimate_whole(scripted: ScriptedServer) -> None:
    scripted.load({"conversations": {"cache": ["a", {"text": "b", "usage": {"input_tokens": 7}}]}})
    _ask(scripted, _body(STEP_1))
    usage = _ask(scripted, _body(STEP_1))
    assert usage["input_tokens"] == 7
    assert usage["cache_read_input_tokens"] == usage["cache_creation_input_tokens"] == 0


def test_a_written_prefix_expires_five_minutes_after_its_last_use() -> None:
    cache = PromptCache()
    blocks = prefix_blocks(_body(STEP_1))
    assert cache.usage(blocks, now=0.0)["cache_creation_input_tokens"] > 0
    assert cache.usage(blocks, now=299.0)["cache_read_input_tokens"] > 0  # a read refreshes it
    assert cache.usage(blocks, now=598.0)["cache_read_input_tokens"] > 0
    assert cache.usage(blocks, now=898.0)["cache_read_input_tokens"] == 0  # gone: written again
