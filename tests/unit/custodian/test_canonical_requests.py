"""The model proxy's reading of a request, as pure functions: one JSON object with each key
once (`parse_body`), the allowlist of the Messages API (`check_shape`), the custodian's own
serialisation (`encode_body`), and the headers that go upstream (`forwarded_headers`). The
same rules against a real custodian and a recording provider: tests/attack/test_model_requests.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral_custodian.model_rules import (
    ALLOWED_BETAS,
    ModelRefusal,
    check_shape,
    encode_body,
    forwarded_headers,
    parse_body,
)
from corral_harness.engine.lean_engine import encode_request

PNG = "iVBORw0KGgo="


def _request(**extra: Any) -> dict[str, Any]:
    """A request as the harness sends one mid-turn: every block type it can carry."""
    return {
        "model": "claude-haiku-4-5",
        "max_tokens": 2000,
        "messages": [
            {"role": "user", "content": "fix the build"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "look first", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Looking.", "citations": [
                        {"type": "char_location", "cited_text": "log", "document_index": 0,
                         "document_title": None, "start_char_index": 0, "end_char_index": 3}]},
                    {"type": "tool_use", "id": "t1", "name": "bash",
                     "input": {"command": "make", "any": {"nested": [1, {"x": None}]}}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                     "content": [
                         {"type": "text", "text": "make: *** [all] Error 1"},
                         {"type": "image", "source": {"type": "base64",
                          "media_type": "image/png", "data": PNG}},
                     ]},
                    {"type": "document", "title": "log", "citations": {"enabled": False},
                     "source": {"type": "text", "media_type": "text/plain", "data": "log"},
                     "cache_control": {"type": "ephemeral"}},
                    {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral",
                                                                         "ttl": "5m"}},
                ],
            },
        ],
        "system": [{"type": "text", "text": "You are careful.",
                    "cache_control": {"type": "ephemeral"}}],
        "metadata": {"user_id": "conv"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "stream": True,
        "tools": [{"name": "bash", "description": "run", "input_schema": {"type": "object"},
                   "cache_control": {"type": "ephemeral"}}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": False},
        "stop_sequences": ["\n\nHuman:"],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        **extra,
    }  # fmt: skip


def _refusal(value: object) -> str:
    assert isinstance(value, ModelRefusal), value
    assert (value.status, value.kind) == (400, "invalid_request_error")
    return value.message


def test_what_the_harness_sends_passes_and_goes_on_as_the_lean_engine_wrote_it() -> None:
    body = _request()
    assert check_shape(body) is None
    assert check_shape({"model": "m", "max_tokens": 1, "messages": [], "system": "plain"}) is None
    assert check_shape(_request(thinking={"type": "disabled"})) is None
    # The lean engine's bytes parse and re-serialise to themselves: its requests reach the
    # provider byte for byte (and their reservation is unchanged).
    sent = encode_request(body)
    parsed = parse_body(sent)
    assert parsed == body and encode_body(parsed) == sent


def test_a_key_given_twice_is_refused_naming_where_it_is() -> None:
    twice = b'{"model": "claude-opus-4-1", "max_tokens": 5, "model": "claude-haiku-4-5"}'
    assert "'model' appears more than once" in _refusal(parse_body(twice))
    nested = json.dumps(_request()).replace('"command": "make"', '"command": "a", "command": "b"')
    where = _refusal(parse_body(nested.encode()))
    assert "'messages[1].content[3].input.command' appears more than once" in where
    system = json.dumps(_request()).replace('"ttl": "5m"', '"ttl": "5m", "ttl": "1h"')
    assert "messages[2].content[2].cache_control.ttl" in _refusal(parse_body(system.encode()))


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"[1, 2]", "must be an object"),
        (b'{"max_tokens": NaN}', "NaN is not a JSON number"),
        (b'{"top_p": Infinity}', "Infinity is not a JSON number"),
        (b"{", "not JSON"),
        (b"[" * 200_000, "nested too deeply"),
    ],
)
def test_what_is_not_one_json_object_is_refused(raw: bytes, fragment: str) -> None:
    assert fragment in _refusal(parse_body(raw))


def _at(body: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    target: Any = body
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        (["service_tier"], "priority", "'service_tier' is not allowed"),
        (["mcp_servers"], [], "'mcp_servers' is not allowed"),
        (["container"], "c1", "'container' is not allowed"),
        (["metadata", "tenant"], "x", "'metadata.tenant' is not allowed"),
        (["messages", 0, "name"], "x", "'messages[0].name' is not allowed"),
        (["messages", 0, "role"], "system", "'messages[0].role' is 'system'"),
        (["messages", 1, "content", 0],
         {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
         "'messages[1].content[0].type' is 'server_tool_use': the block types allowed"),
        (["messages", 2, "content", 0, "content", 0],
         {"type": "search_result", "source": "x", "title": "t", "content": []},
         "'messages[2].content[0].content[0].type' is 'search_result'"),
        (["messages", 1, "content", 2, "citations"],
         [{"type": "web_search_result_location", "cited_text": "x", "url": "https://e.x"}],
         "'messages[1].content[2].citations[0].type' is 'web_search_result_location'"),
        (["messages", 1, "content", 2, "citations"],
         [{"type": "char_location", "cited_text": "x", "document_index": 0, "url": "u"}],
         "'messages[1].content[2].citations[0].url' is not allowed"),
        (["messages", 2, "content", 0, "content", 0, "citations"], [],
         "'messages[2].content[0].content[0].citations' is not allowed"),
        (["messages", 2, "content", 0, "content", 1, "source"],
         {"type": "url", "url": "https://example.com/a.png"},
         "'messages[2].content[0].content[1].source.type' is 'url': only 'base64' sources"),
        (["messages", 2, "content", 1, "source"], {"type": "file", "file_id": "file_1"},
         "'messages[2].content[1].source.type' is 'file': only 'base64' or 'text' sources"),
        (["messages", 2, "content", 1, "source", "url"], "https://example.com/a.pdf",
         "'messages[2].content[1].source.url' is not allowed"),
        (["messages", 2, "content", 2, "cache_control", "ttl"], "1h",
         "'messages[2].content[2].cache_control.ttl' is '1h'; allowed: '5m'"),
        (["tools", 0], {"type": "web_search_20250305", "name": "web_search"},
         "server tool 'web_search_20250305' is not allowed"),
        (["tools", 0], {"type": "computer_20250124", "name": "computer"},
         "server tool 'computer_20250124'"),
        (["tools", 0, "input_examples"], [], "'tools[0].input_examples' is not allowed"),
        (["tool_choice", "type"], "required", "'tool_choice.type' is 'required'"),
        (["thinking"], {"type": "adaptive"}, "'thinking.type' is 'adaptive'"),
        (["thinking", "display"], "x", "'thinking.display' is not allowed"),
        (["stream"], "yes", "'stream' must be true or false"),
        (["messages", 1, "content", 3, "input"], "rm -rf", "content[3].input' must be an object"),
    ],
)  # fmt: skip
def test_what_the_allowlist_does_not_name_is_refused_naming_it(
    path: list[Any], value: Any, fragment: str
) -> None:
    assert fragment in _refusal(check_shape(_at(_request(), path, value)))


def test_only_the_api_version_and_allowed_betas_go_upstream() -> None:
    beta = sorted(ALLOWED_BETAS)[0]
    kept = forwarded_headers(
        [
            ("Anthropic-Version", "2023-06-01"),
            ("anthropic-beta", f" {beta} "),
            ("user-agent", "Anthropic/Python 0.70"),
            ("x-stainless-lang", "python"),
            ("content-type", "application/json"),
            ("x-api-key", "pod-local-credential"),
            ("authorization", "Bearer pod-local-credential"),
            ("x-corral-run-id", "run-1"),
            ("cookie", "a=b"),
        ]
    )
    assert kept == {"anthropic-version": "2023-06-01", "anthropic-beta": beta}
    for headers, fragment in (
        ([("anthropic-dangerous-direct-browser-access", "true")], "header 'anthropic-danger"),
        ([("anthropic-beta", "context-1m-2025-08-07")], "beta 'context-1m-2025-08-07'"),
        ([("anthropic-beta", f"{beta},mcp-client-2025-04-04")], "beta 'mcp-client-2025-04-04'"),
        ([("anthropic-version", "latest")], "must be a date"),
        ([("anthropic-version", "2023-06-01"), ("anthropic-version", "2024-01-01")], "twice"),
    ):
        message = _refusal(forwarded_headers(headers))
        assert fragment in message.replace("more than once", "twice"), message
