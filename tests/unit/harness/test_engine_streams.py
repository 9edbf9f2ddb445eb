"""Both engine adapters against streams the real API (and the custodian before it) sends that
the scripted model does not: a tool call cut off at max_tokens, a connection dropped mid-line,
`retry-after`, `pause_turn`, and a failed stream's partial answer.

Each test runs once per adapter (`sdk`, the reference, and `lean`) against a loopback server
that answers each request with the next of a list of raw HTTP responses written here.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral_common.catalog import resolve_model
from corral_harness.engine import _loop
from corral_harness.engine._loop import EngineSettings, StreamingEngine
from corral_harness.engine.anthropic_engine import AnthropicEngine
from corral_harness.engine.lean_engine import LeanEngine
from corral_harness.engine.messages import for_provider
from corral_harness.engine.seam import (
    ALLOW,
    EngineEvent,
    EngineJob,
    EngineOutcome,
    EngineTool,
    MessageEnd,
    RequestPlan,
    ToolEnd,
    ToolGate,
)
from corral_harness.paths import GrantedRoot
from corral_harness.ports import ToolCall
from corral_harness.tools import WorkingTools

pytestmark = pytest.mark.timeout(30)

ADAPTERS: dict[str, type[StreamingEngine]] = {"sdk": AnthropicEngine, "lean": LeanEngine}


@pytest.fixture(params=sorted(ADAPTERS))
def adapter(request: pytest.FixtureRequest) -> type[StreamingEngine]:
    return ADAPTERS[request.param]


class RawServer:
    """Answers the n-th request with the n-th response's bytes, then closes the connection;
    keeps each request's JSON body."""

    def __init__(self, responses: list[bytes]) -> None:
        self.responses = responses
        self.bodies: list[dict[str, Any]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(rest) < length:
                    rest += conn.recv(65536)
                self.bodies.append(json.loads(rest))
                index = len(self.bodies) - 1
                self._answer(conn, self.responses[min(index, len(self.responses) - 1)])

    def _answer(self, conn: socket.socket, response: bytes) -> None:
        conn.sendall(response)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[RawServer] = []

    def start(*responses: bytes) -> RawServer:
        servers.append(RawServer(list(responses)))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def event(name: str, **data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


START = event("message_start", message={"usage": {"input_tokens": 7, "output_tokens": 1}})
STOP = event("message_stop")


def stream(*events: bytes) -> bytes:
    """A 200 event stream that ends with the connection (no length, no chunks)."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    return head + b"".join(events)


def text_block(index: int, text: str) -> bytes:
    return event(
        "content_block_start", index=index, content_block={"type": "text", "text": text}
    ) + event("content_block_stop", index=index)


def ends(stop_reason: str, output_tokens: int = 5) -> bytes:
    return event(
        "message_delta",
        delta={"stop_reason": stop_reason, "stop_sequence": None},
        usage={"output_tokens": output_tokens},
    )


def answer(text: str) -> bytes:
    return stream(START, text_block(0, text), ends("end_turn"), STOP)


def refusal(status: int, kind: str, *headers: str) -> bytes:
    body = json.dumps({"type": "error", "error": {"type": kind, "message": "not now"}}).encode()
    head = f"HTTP/1.1 {status} Refused\r\ncontent-type: application/json\r\n"
    head += "".join(h + "\r\n" for h in headers)
    head += f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    return head.encode() + body


class Hooks:
    async def convert_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return messages

    async def before_request(self, messages: list[dict[str, Any]]) -> RequestPlan:
        return RequestPlan("system prompt", for_provider(messages))

    async def before_tool_call(self, call: ToolCall) -> ToolGate:
        return ALLOW

    def ends_run(self, step: int) -> bool:
        return False


def _job(root: Path) -> EngineJob:
    tools = WorkingTools(GrantedRoot(root))

    def runner(name: str) -> Any:
        return lambda args: tools.run(name, args)

    engine_tools = [EngineTool(spec, runner(spec.name)) for spec in tools.specs()]
    model = resolve_model("corral-scripted")
    return EngineJob("streams", model, "low", "", engine_tools, [], "go", 500)


async def _run(
    adapter: type[StreamingEngine], server: RawServer, root: Path
) -> tuple[EngineOutcome, list[EngineEvent]]:
    seen: list[EngineEvent] = []

    async def listen(event: EngineEvent) -> None:
        seen.append(event)

    engine = adapter(EngineSettings(base_url=server.url, backoff_seconds=0.01))
    outcome = await engine.run(_job(root), Hooks(), listen)
    return outcome, seen


def _cut_call(closed: bool) -> bytes:
    """A bash call whose input stops short: the answer ran out at max_tokens, with the block
    left open, or closed on JSON that does not parse."""
    block = {"type": "tool_use", "id": "toolu_cut", "name": "bash", "input": {}}
    events = [
        START,
        text_block(0, "I will create it."),
        event("content_block_start", index=1, content_block=block),
        event(
            "content_block_delta",
            index=1,
            delta={"type": "input_json_delta", "partial_json": '{"command": "touch ran'},
        ),
    ]
    if closed:
        events.append(event("content_block_stop", index=1))
    return stream(*events, ends("max_tokens"), STOP)


@pytest.mark.parametrize("closed", [False, True], ids=["open", "unparsable"])
async def test_a_tool_call_cut_off_at_max_tokens_never_runs(
    adapter: type[StreamingEngine], serve: Any, tmp_path: Path, closed: bool
) -> None:
    server = serve(_cut_call(closed), answer("done"))
    outcome, seen = await _run(adapter, server, tmp_path)
    assert outcome.status == "completed"
    assert not (tmp_path / "ran").exists()
    first = next(e for e in seen if isinstance(e, MessageEnd))
    assert first.stop_reason == "max_tokens"
    streamed = {"__partial_json__": '{"command": "touch ran'}
    assert first.message["content"][1]["input"] == streamed  # kept, never `{}`
    ended = [e for e in seen if isinstance(e, ToolEnd)]
    assert len(ended) == 1 and ended[0].result.is_error
    assert "did not run" in ended[0].result.content and "max_tokens" in ended[0].result.content
    # The model is told, in the next request, that the call it wrote was not run.
    sent = server.bodies[1]["messages"]
    assert sent[-2]["content"][1]["input"] == streamed
    result = sent[-1]["content"][0]
    assert result["tool_use_id"] == "toolu_cut" and result["is_error"] is True
    assert "max_tokens" in result["content"]


# What the custodian sends when its upstream breaks off (`_proxy._RelayedStream`).
BROKE_OFF = b"\n\n" + event(
    "error", error={"type": "api_error", "message": "the model upstream broke off the stream"}
)
CUT_LINE = b'event: content_block_delta\ndata: {"type": "content_block_delta", "ind'


async def test_a_drop_mid_line_is_an_api_error_and_keeps_the_partial_answer(
    adapter: type[StreamingEngine], serve: Any, tmp_path: Path
) -> None:
    server = serve(stream(START, text_block(0, "Half an answer"), CUT_LINE, BROKE_OFF))
    outcome, seen = await _run(adapter, server, tmp_path)
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error.type == "api_error", outcome.error
    assert "broke off" in outcome.error.message
    assert len(server.bodies) == 1  # text had been forwarded: no retry
    # The failed answer is in the record: its text and the tokens it was charged.
    [end] = [e for e in seen if isinstance(e, MessageEnd)]
    assert end.stop_reason == "error"
    assert end.message["content"] == [{"type": "text", "text": "Half an answer"}]
    assert end.usage is not None and end.usage.input == 7


async def test_an_event_that_is_not_json_fails_the_stream_as_data(
    adapter: type[StreamingEngine], serve: Any, tmp_path: Path
) -> None:
    """Without an error event after it, the undecodable event is the failure: a model error
    (retried while nothing was forwarded), never an exception out of the loop."""
    server = serve(stream(START, CUT_LINE, b"\n\n"))
    outcome, seen = await _run(adapter, server, tmp_path)
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error.type == "model_error"
    assert "not JSON" in outcome.error.message
    assert len(server.bodies) == 3
    [end] = [e for e in seen if isinstance(e, MessageEnd)]
    assert end.message["content"] == [] and end.usage is not None and end.usage.input == 7


@pytest.mark.parametrize(
    ("header", "least"), [("retry-after: 1", 1.0), ("retry-after-ms: 400", 0.4)]
)
async def test_retry_after_is_waited_before_the_retry(
    adapter: type[StreamingEngine], serve: Any, tmp_path: Path, header: str, least: float
) -> None:
    server = serve(refusal(429, "rate_limit_error", header), answer("done"))
    began = time.monotonic()
    outcome, _ = await _run(adapter, server, tmp_path)
    took = time.monotonic() - began
    assert outcome.status == "completed"
    assert len(server.bodies) == 2
    assert took >= least - 0.05, took


async def test_a_long_retry_after_is_capped(
    adapter: type[StreamingEngine], serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_loop, "RETRY_AFTER_CAP_SECONDS", 0.2)
    server = serve(refusal(529, "overloaded_error", "retry-after: 3600"), answer("done"))
    began = time.monotonic()
    outcome, _ = await _run(adapter, server, tmp_path)
    assert outcome.status == "completed" and len(server.bodies) == 2
    assert 0.15 <= time.monotonic() - began < 5


async def test_a_budget_refusal_is_never_retried(
    adapter: type[StreamingEngine], serve: Any, tmp_path: Path
) -> None:
    """Even with no `x-should-retry` to say so: the budget would refuse every try."""
    server = serve(refusal(429, "budget_exceeded_error", "retry-after: 0"), answer("done"))
    outcome, _ = await _run(adapter, server, tmp_path)
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error.type == "budget_exceeded_error"
    assert len(server.bodies) == 1


async def test_pause_turn_continues_the_turn_with_the_paused_answer(
    adapter: type[StreamingEngine], serve: Any, tmp_path: Path
) -> None:
    paused = stream(START, text_block(0, "Still searching"), ends("pause_turn"), STOP)
    server = serve(paused, answer("found it"))
    outcome, seen = await _run(adapter, server, tmp_path)
    assert outcome.status == "completed"
    assert [e.stop_reason for e in seen if isinstance(e, MessageEnd)] == ["pause_turn", "end_turn"]
    assert len(server.bodies) == 2
    last = server.bodies[1]["messages"][-1]
    assert last == {"role": "assistant", "content": [{"type": "text", "text": "Still searching"}]}


async def test_a_failed_streams_whole_tool_call_is_kept_and_left_unanswered(
    adapter: type[StreamingEngine], serve: Any, tmp_path: Path
) -> None:
    block = {"type": "tool_use", "id": "toolu_whole", "name": "bash", "input": {}}
    whole = event("content_block_start", index=0, content_block=block) + event(
        "content_block_delta",
        index=0,
        delta={"type": "input_json_delta", "partial_json": '{"command": "touch ran"}'},
    )
    server = serve(stream(START, whole, event("content_block_stop", index=0), CUT_LINE, BROKE_OFF))
    outcome, seen = await _run(adapter, server, tmp_path)
    assert outcome.status == "failed" and not (tmp_path / "ran").exists()
    assert [call.id for call in outcome.unanswered] == ["toolu_whole"]
    [end] = [e for e in seen if isinstance(e, MessageEnd)]
    assert end.message["content"][0]["input"] == {"command": "touch ran"}
