"""The model proxy, attacked as a hostile harness would: a real custodian process before a real
HTTP provider that records every byte it receives and answers with streams framed as the
event-stream format allows (multi-line data, lone CR line ends) or with no usage at all.

A body the custodian would read one way and the provider another (a key given twice), a block,
field or header the allowlist does not name, must be refused before anything goes upstream;
what does go upstream must be the custodian's own serialisation of what it checked; and every
answer must be charged: its usage however the stream is framed, the whole reservation when
its usage cannot be read.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from ..unit.custodian._custodian_proc import Custodian, running_custodian

pytestmark = pytest.mark.timeout(120)

MODEL_KEY = "sk-ant-model-requests-attack-0123456789"
MODEL = "claude-haiku-4-5"


def _events(
    usage_start: dict[str, int] | None, usage_end: dict[str, int] | None
) -> list[dict[str, Any]]:
    start: dict[str, Any] = {"id": "msg_1", "type": "message", "role": "assistant",
                             "model": MODEL, "content": []}  # fmt: skip
    if usage_start is not None:
        start["usage"] = usage_start
    end: dict[str, Any] = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
    if usage_end is not None:
        end["usage"] = usage_end
    return [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": "hello"}},
        {"type": "content_block_stop", "index": 0},
        end,
        {"type": "message_stop"},
    ]  # fmt: skip


def _frame(events: list[dict[str, Any]], *, eol: bytes, multiline: bool) -> bytes:
    out = b""
    for event in events:
        text = json.dumps(event).encode()
        # JSON may break between any two tokens: each comma starts a new `data` line.
        lines = text.replace(b", ", b",\n").split(b"\n") if multiline else [text]
        out += b"event: " + event["type"].encode() + eol
        out += b"".join(b"data: " + line + eol for line in lines) + eol
    return out


# What the provider answers, by the request's metadata.user_id.
STREAMS = {
    "multi-line": _frame(
        _events({"input_tokens": 321, "output_tokens": 1}, {"output_tokens": 45}),
        eol=b"\n", multiline=True,
    ),
    "lone-cr": _frame(
        _events({"input_tokens": 222, "output_tokens": 1}, {"output_tokens": 33}),
        eol=b"\r", multiline=True,
    ),
    "no-usage": _frame(_events(None, None), eol=b"\n", multiline=False),
    "plain": _frame(
        _events({"input_tokens": 10, "output_tokens": 1}, {"output_tokens": 2}),
        eol=b"\n", multiline=False,
    ),
}  # fmt: skip
BODIES = {
    "json-no-usage": {"id": "msg_2", "type": "message", "role": "assistant", "model": MODEL,
                      "content": [{"type": "text", "text": "hi"}]},
}  # fmt: skip


@dataclass
class Provider:
    url: str
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


def _serve() -> tuple[ThreadingHTTPServer, Provider]:
    provider = Provider("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            provider.received.append(({k.lower(): v for k, v in self.headers.items()}, raw))
            conversation = str(json.loads(raw).get("metadata", {}).get("user_id", "plain"))
            if conversation in BODIES:
                data = json.dumps(BODIES[conversation]).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            stream = STREAMS[conversation]
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()  # HTTP/1.0: the body runs to the connection's end
            for i in range(0, len(stream), 7):  # odd pieces: lines and CRs cut across writes
                self.wfile.write(stream[i : i + 7])
                self.wfile.flush()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    provider.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, provider


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Custodian, Provider]]:
    server, provider = _serve()
    log = tmp_path_factory.mktemp("model-requests") / "custodian.log"
    env = {
        "CORRAL_UPSTREAM_URL": provider.url,
        "ANTHROPIC_API_KEY": MODEL_KEY,
        "CORRAL_AGENT_SPEC_JSON": json.dumps({"identity": "x", "model": MODEL}),
    }
    try:
        with running_custodian(env, log) as custodian:
            yield custodian, provider
    finally:
        server.shutdown()
        server.server_close()


def _send(custodian: Custodian, raw: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        custodian.url + "/v1/messages",
        content=raw,
        headers={**custodian.headers, "content-type": "application/json",
                 "anthropic-version": "2023-06-01", **headers},
        timeout=30,
    )  # fmt: skip


def _request(conversation: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 300,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": conversation},
        "stream": True,
        **extra,
    }


def _refused(answer: httpx.Response) -> str:
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert answer.headers["x-should-retry"] == "false"
    return str(body["error"]["message"])


def _spent(custodian: Custodian) -> dict[str, Any]:
    usage: Any = custodian.usage()
    assert usage["reserved"]["output"] == 0, usage  # nothing left in flight
    return dict(usage["usage"])


def test_a_key_given_twice_is_refused_and_nothing_reaches_the_provider(
    proxy: tuple[Custodian, Provider],
) -> None:
    custodian, provider = proxy
    before, spent = len(provider.received), _spent(custodian)
    # The check would read the last `model` (allowed); a provider reading the first would run
    # the expensive one.
    twice = (
        b'{"model": "claude-opus-4-1", "max_tokens": 300, "messages": [{"role": "user", '
        b'"content": "hi"}], "model": "claude-haiku-4-5", "metadata": {"user_id": "plain"}}'
    )
    assert "the key 'model' appears more than once" in _refused(_send(custodian, twice))
    # Anywhere in the body: a max_tokens twice inside the thinking object, a tool input's key.
    nested = json.dumps(_request("plain", thinking={"type": "enabled", "budget_tokens": 1024}))
    nested = nested.replace('"budget_tokens": 1024', '"budget_tokens": 1024, "budget_tokens": 9')
    assert "'thinking.budget_tokens' appears more than once" in _refused(
        _send(custodian, nested.encode())
    )
    assert len(provider.received) == before
    assert _spent(custodian) == spent  # nothing reserved, nothing charged


@pytest.mark.parametrize(
    ("change", "headers", "fragment"),
    [
        ({"messages": [{"role": "user", "content": [
            {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}}]}]},
         {}, "'messages[0].content[0].type' is 'server_tool_use'"),
        ({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/x.png"}}]}]},
         {}, "'messages[0].content[0].source.type' is 'url'"),
        ({"messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "file", "file_id": "file_011"}}]}]},
         {}, "'messages[0].content[0].source.type' is 'file'"),
        ({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi", "citations": [{"type": "web_search_result_location"}]}
        ]}]}, {}, "'messages[0].content[0].citations[0].type' is 'web_search_result_location'"),
        ({"container": "container_1"}, {}, "'container' is not allowed"),
        ({"tools": [{"type": "code_execution_20250522", "name": "code_execution"}]}, {},
         "server tool 'code_execution_20250522' is not allowed"),
        ({}, {"anthropic-beta": "context-1m-2025-08-07"}, "beta 'context-1m-2025-08-07'"),
        ({}, {"anthropic-dangerous-direct-browser-access": "true"},
         "header 'anthropic-dangerous-direct-browser-access' is not allowed"),
    ],
)  # fmt: skip
def test_an_unlisted_block_field_or_header_is_refused_before_the_provider(
    proxy: tuple[Custodian, Provider],
    change: dict[str, Any],
    headers: dict[str, str],
    fragment: str,
) -> None:
    custodian, provider = proxy
    before = len(provider.received)
    answer = _send(custodian, json.dumps(_request("plain", **change)).encode(), **headers)
    assert fragment in _refused(answer)
    assert len(provider.received) == before


def test_what_reaches_the_provider_is_the_custodians_serialisation(
    proxy: tuple[Custodian, Provider],
) -> None:
    custodian, provider = proxy
    # Odd whitespace, escapes the custodian writes otherwise, and keys in an unusual order.
    raw = (
        b'{ "stream" :true,\n\t"metadata":{"user_id":"plain"} , "messages" : [ {"content":'
        b' "h\\u0069 caf\xc3\xa9", "role":"user"} ],"max_tokens":   300 ,'
        b'"model":"claude-haiku-4-5"}'
    )
    answer = _send(
        custodian, raw, **{"user-agent": "evil/1", "x-stainless-lang": "python",
                           "x-corral-run-id": "run-1", "cookie": "session=abc"}
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    headers, forwarded = provider.received[-1]
    assert forwarded != raw
    assert forwarded == json.dumps(json.loads(raw)).encode()  # the checked object, re-written
    assert list(json.loads(forwarded)) == ["stream", "metadata", "messages", "max_tokens", "model"]
    # The caller's credential and ordinary headers stop at the custodian; the key is its own.
    assert headers["x-api-key"] == MODEL_KEY and headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in headers and "cookie" not in headers
    assert "x-stainless-lang" not in headers and "x-corral-run-id" not in headers
    assert headers.get("user-agent", "") != "evil/1"
    assert custodian.credential not in json.dumps(headers)
    # The answer came back to the caller byte for byte as the provider framed it.
    assert answer.content == STREAMS["plain"]


@pytest.mark.parametrize("conversation", ["multi-line", "lone-cr"])
def test_a_stream_framed_as_the_format_allows_is_charged_its_usage(
    proxy: tuple[Custodian, Provider], conversation: str
) -> None:
    custodian, _ = proxy
    before = _spent(custodian)
    answer = _send(custodian, json.dumps(_request(conversation)).encode())
    assert answer.status_code == 200, answer.text
    assert answer.content == STREAMS[conversation]  # relayed untouched
    expected = {"multi-line": (321, 45), "lone-cr": (222, 33)}[conversation]
    after = _wait_settled(custodian, before)
    assert (after["input"] - before["input"], after["output"] - before["output"]) == expected


def test_an_answer_whose_usage_cannot_be_read_is_charged_the_whole_reservation(
    proxy: tuple[Custodian, Provider],
) -> None:
    custodian, provider = proxy
    for conversation in ("no-usage", "json-no-usage"):
        before = _spent(custodian)
        body = _request(conversation, stream=conversation == "no-usage")
        answer = _send(custodian, json.dumps(body).encode())
        assert answer.status_code == 200, answer.text
        _, forwarded = provider.received[-1]
        after = _wait_settled(custodian, before)
        # The reservation: ceil(bytes forwarded / 4) of input, all of max_tokens of output.
        charged = (after["input"] - before["input"], after["output"] - before["output"])
        assert charged == (math.ceil(len(forwarded) / 4), 300), conversation
    log = custodian.log.read_text()
    assert "the stream ended without its final usage (message_delta): the whole reservation" in log
    assert "the answer reported no usage: the whole reservation is charged" in log


def _wait_settled(custodian: Custodian, before: dict[str, Any]) -> dict[str, Any]:
    """The totals once the request settled (a relayed stream settles as its response ends);
    every answer is charged something, so the totals move."""
    deadline = time.monotonic() + 10
    while True:
        usage: Any = custodian.usage()
        spent = (usage["usage"]["input"], usage["usage"]["output"])
        if usage["reserved"]["output"] == 0 and spent != (before["input"], before["output"]):
            return dict(usage["usage"])
        assert time.monotonic() < deadline, usage
        time.sleep(0.05)
