"""Blocks of a tool the API runs itself (web search), as both engine adapters meet them: the
`server_tool_use` call with its streamed input, the `*_tool_result` block given whole (one the
SDK has no type for too), and text with `citations_delta`. Every adapter must store the same
blocks, equal to what the API sent, and send them back so on the next request.

The custodian refuses every server tool in a pod; these streams come from a loopback server
standing in for the API itself. One case list, every adapter (`sdk`, the reference; `lean` over
its small client and over httpx) run on each case and compared with each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corral_harness.engine._loop import StreamingEngine
from corral_harness.engine.anthropic_engine import AnthropicEngine
from corral_harness.engine.lean_engine import LeanEngine
from corral_harness.engine.seam import MessageEnd, ToolEnd

from .test_engine_streams import _run, answer, event, serve, stream

__all__ = ["serve"]  # the loopback server fixture, used here by name

pytestmark = pytest.mark.timeout(60)


class LeanOverHttpx(LeanEngine):
    direct = False


ADAPTERS: dict[str, type[StreamingEngine]] = {
    "sdk": AnthropicEngine,
    "lean": LeanEngine,
    "lean-httpx": LeanOverHttpx,
}

MESSAGE_START = event(
    "message_start",
    message={
        "id": "msg_01Search",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 2679,
            "output_tokens": 3,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "server_tool_use": {"web_search_requests": 0},
        },
    },
)
MESSAGE_STOP = event("message_stop")
SEARCH_ID = "srvtoolu_014hJH82Qum7Td6UV8gDXThB"
RESULTS = [
    {
        "type": "web_search_result",
        "title": "Corral: sandboxed coding agents on Kubernetes",
        "url": "https://corral.example/docs",
        "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5LTQ1NGUtODgxNC1kNjNjNTk1ZWI3Y",
        "page_age": "April 30, 2026",
    },
    {
        "type": "web_search_result",
        "title": "Operators and pods",
        "url": "https://corral.example/pods",
        "encrypted_content": "EpMGCioIARgBIiQ4ODk4YTFkYy0yMjEwLTQ2ZTQtYTkxYy1iNjU2OTM1ZjRjY",
        "page_age": None,  # a null the API sends: kept, not dropped
    },
]
CITATIONS = [
    {
        "type": "web_search_result_location",
        "cited_text": "Corral runs each coding agent in a sandboxed pod of its own.",
        "url": "https://corral.example/docs",
        "title": "Corral: sandboxed coding agents on Kubernetes",
        "encrypted_index": "Eo8BCioIAhgBIiQyYjQ0OWJmZi1lNm",
    },
    {
        "type": "web_search_result_location",
        "cited_text": "An operator reconciles a Session into its pod.",
        "url": "https://corral.example/pods",
        "title": "Operators and pods",
        "encrypted_index": "Eo8BCioIAhgBIiQ0ZDRmNjM1Zi04Nm",
    },
]


def _start(index: int, block: dict[str, Any]) -> bytes:
    return event("content_block_start", index=index, content_block=block)


def _delta(index: int, delta: dict[str, Any]) -> bytes:
    return event("content_block_delta", index=index, delta=delta)


def _stop(index: int) -> bytes:
    return event("content_block_stop", index=index)


def _text(index: int, text: str) -> bytes:
    return (
        _start(index, {"type": "text", "text": ""})
        + _delta(index, {"type": "text_delta", "text": text})
        + _stop(index)
    )


def _server_call(index: int, name: str, json_pieces: list[str]) -> bytes:
    """A server tool's call: its input `{}` at the start, then streamed like a tool_use's."""
    start = _start(index, {"type": "server_tool_use", "id": SEARCH_ID, "name": name, "input": {}})
    pieces = [_delta(index, {"type": "input_json_delta", "partial_json": p}) for p in json_pieces]
    return start + b"".join(pieces) + _stop(index)


def _whole(index: int, block: dict[str, Any]) -> bytes:
    """A block the API gives whole at its start, with no delta."""
    return _start(index, block) + _stop(index)


def _cited(index: int, parts: list[str | dict[str, Any]]) -> bytes:
    """A text block whose citations stream before the text they stand for."""
    out = _start(index, {"type": "text", "text": ""})
    for part in parts:
        if isinstance(part, str):
            out += _delta(index, {"type": "text_delta", "text": part})
        else:
            out += _delta(index, {"type": "citations_delta", "citation": part})
    return out + _stop(index)


def _ends(stop_reason: str) -> bytes:
    return event(
        "message_delta",
        delta={"stop_reason": stop_reason, "stop_sequence": None},
        usage={"output_tokens": 510, "server_tool_use": {"web_search_requests": 1}},
    )


@dataclass(frozen=True)
class Case:
    name: str
    events: bytes  # the answer's stream, between message_start and message_delta
    blocks: list[dict[str, Any]]  # what must be stored, and sent back on the next request
    stop_reason: str = "pause_turn"


QUERY = ['{"query": ', '"corral kubernetes', ' operator"}']
CALL: dict[str, Any] = {
    "type": "server_tool_use",
    "id": SEARCH_ID,
    "name": "web_search",
    "input": {"query": "corral kubernetes operator"},
}
RESULT: dict[str, Any] = {
    "type": "web_search_tool_result",
    "tool_use_id": SEARCH_ID,
    "content": RESULTS,
}
SEARCHED = (
    _text(0, "I'll search for that.")
    + _server_call(1, "web_search", QUERY)
    + _whole(2, RESULT)
    + _cited(3, [CITATIONS[0], "Corral runs each agent in its own pod", CITATIONS[1], "."])
)
SEARCHED_BLOCKS: list[dict[str, Any]] = [
    {"type": "text", "text": "I'll search for that."},
    CALL,
    RESULT,
    {"type": "text", "text": "Corral runs each agent in its own pod.", "citations": CITATIONS},
]
GLOB_CALL: dict[str, Any] = {
    "type": "tool_use",
    "id": "toolu_glob",
    "name": "glob",
    "input": {"pattern": "*"},
}
FAILED_SEARCH: dict[str, Any] = {
    "type": "web_search_tool_result",
    "tool_use_id": SEARCH_ID,
    "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"},
}
# A result type newer than the SDK: it has no class for it, and must not lose a field either.
NEWER: dict[str, Any] = {
    "type": "future_lookup_tool_result",
    "tool_use_id": SEARCH_ID,
    "content": {"found": [{"id": 7, "note": None}], "cursor": None},
    "retrieved_at": None,
}

CASES = [
    Case("web-search-paused", SEARCHED, SEARCHED_BLOCKS),
    Case(
        "web-search-then-a-harness-tool",
        SEARCHED
        + _start(4, {**GLOB_CALL, "input": {}})
        + _delta(4, {"type": "input_json_delta", "partial_json": '{"pattern": "*"}'})
        + _stop(4),
        [*SEARCHED_BLOCKS, GLOB_CALL],
        stop_reason="tool_use",
    ),
    Case(
        "web-search-error-result",
        _server_call(0, "web_search", ['{"query": "corral"}']) + _whole(1, FAILED_SEARCH),
        [{**CALL, "input": {"query": "corral"}}, FAILED_SEARCH],
    ),
    Case(
        "a-result-type-the-sdk-does-not-know",
        _server_call(0, "future_lookup", ['{"id"', ": 7}"]) + _whole(1, NEWER),
        [{**CALL, "name": "future_lookup", "input": {"id": 7}}, NEWER],
    ),
]


def _unmarked(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks without the prompt-cache marker a request may put on a copy of its last one
    (`engine/caching.py`): the marker is the request's, not the answer's."""
    return [{k: v for k, v in block.items() if k != "cache_control"} for block in blocks]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
async def test_server_tool_blocks_are_stored_alike_and_sent_back_as_the_api_sent_them(
    serve: Any, tmp_path: Path, case: Case
) -> None:
    stored: dict[str, list[dict[str, Any]]] = {}
    for name, adapter in ADAPTERS.items():
        answered = stream(MESSAGE_START, case.events, _ends(case.stop_reason), MESSAGE_STOP)
        server = serve(answered, answer("done"))
        outcome, seen = await _run(adapter, server, tmp_path)
        assert outcome.status == "completed", (name, outcome.error)
        first = next(e for e in seen if isinstance(e, MessageEnd))
        assert first.stop_reason == case.stop_reason, name
        stored[name] = first.message["content"]
        assert stored[name] == case.blocks, name
        # The next request sends the answer back as it was stored (after a harness tool's
        # call, with that call's result after it).
        sent = server.bodies[1]["messages"]
        back = sent[-1] if case.stop_reason == "pause_turn" else sent[-2]
        assert back["role"] == "assistant" and _unmarked(back["content"]) == case.blocks, name
        if case.stop_reason == "tool_use":
            [ran] = [e for e in seen if isinstance(e, ToolEnd)]
            assert ran.call.id == sent[-1]["content"][0]["tool_use_id"] == "toolu_glob"
    for name, blocks in stored.items():
        assert blocks == stored["sdk"], f"{name} stored other blocks than the SDK adapter"
