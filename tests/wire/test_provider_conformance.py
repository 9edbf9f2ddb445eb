"""Every engine case over every provider (docs/providers.md): both engine adapters (the SDK's,
the reference, and the lean one) drive a real custodian process whose provider is the Messages
API itself, a gateway, Amazon Bedrock or Google Vertex AI, each through its stand-in (which
checks signatures and tokens with botocore and google-auth), with one loopback upstream behind
them that answers each request with the next raw HTTP response of the case.

The same stream, translated there and back (Bedrock's event-stream frames, Vertex's paths and
tokens), must give the same outcome, the same record and the same usage in the custodian's
books, whichever provider carried it.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corral_api.providers import ModelProvider
from corral_dev.providers._bedrock import BedrockStandIn
from corral_dev.providers._bedrock import serve_in_thread as serve_bedrock
from corral_dev.providers._gateway import GatewayStandIn, serve_gateway_in_thread
from corral_dev.providers._vertex import (
    VertexStandIn,
    make_service_account,
    serve_vertex_in_thread,
)
from corral_harness.engine._loop import EngineSettings, StreamingEngine
from corral_harness.engine.anthropic_engine import AnthropicEngine
from corral_harness.engine.lean_engine import LeanEngine
from corral_harness.engine.seam import EngineEvent, EngineOutcome, MessageEnd, ToolEnd
from tests.unit.custodian._custodian_proc import Custodian, running_custodian
from tests.unit.harness.test_engine_streams import (
    START,
    STOP,
    Hooks,
    _job,
    ends,
    event,
    text_block,
)

pytestmark = pytest.mark.timeout(60)

ADAPTERS: dict[str, type[StreamingEngine]] = {"sdk": AnthropicEngine, "lean": LeanEngine}
PROVIDERS = ("anthropic", "gateway", "bedrock", "vertex")
AGENT = {"identity": "You are a test agent.", "model": "corral-scripted"}
GATEWAY_KEY = "gateway-key-for-the-conformance-suite"
# Tokens the budget case's custodian may spend: more than one request reserves, less than what
# the first answer reports, so the second request is refused from the provider's usage.
BUDGET_TOKENS = 3000


class Upstream:
    """The Messages API behind every stand-in: answers the n-th request with the case's n-th
    raw response (chunked; a response without its last chunk is a connection cut mid-body)."""

    def __init__(self) -> None:
        self.responses: list[bytes] = []
        self.bodies: list[dict[str, Any]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def load(self, *responses: bytes) -> None:
        with self._lock:
            self.responses = list(responses)
            self.bodies = []

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                piece = conn.recv(65536)
                if not piece:
                    return
                data += piece
            head, _, rest = data.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(rest) < length:
                rest += conn.recv(65536)
            with self._lock:
                self.bodies.append(json.loads(rest))
                index = len(self.bodies) - 1
                response = self.responses[min(index, len(self.responses) - 1)]
            conn.sendall(response)

    def close(self) -> None:
        self.listener.close()


def chunked(
    status: str, content_type: str, body: bytes, *headers: str, whole: bool = True
) -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\n"
    head += "".join(h + "\r\n" for h in headers)
    head += "transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    out = head.encode() + f"{len(body):x}\r\n".encode() + body + b"\r\n"
    return out + (b"0\r\n\r\n" if whole else b"")


def stream(*events: bytes, whole: bool = True) -> bytes:
    return chunked("200 OK", "text/event-stream", b"".join(events), whole=whole)


def refusal(status: int, kind: str, *headers: str) -> bytes:
    body = json.dumps({"type": "error", "error": {"type": kind, "message": "not now"}}).encode()
    return chunked(f"{status} Refused", "application/json", body, *headers)


def answer(text: str, input_tokens: int = 7) -> bytes:
    start = event(
        "message_start", message={"usage": {"input_tokens": input_tokens, "output_tokens": 1}}
    )
    return stream(start, text_block(0, text), ends("end_turn"), STOP)


def tool_call(command: str, *, input_tokens: int = 7, closed: bool = True) -> bytes:
    block = {"type": "tool_use", "id": "toolu_case", "name": "bash", "input": {}}
    start = event(
        "message_start", message={"usage": {"input_tokens": input_tokens, "output_tokens": 1}}
    )
    events = [
        start,
        event("content_block_start", index=0, content_block=block),
        event(
            "content_block_delta",
            index=0,
            delta={
                "type": "input_json_delta",
                "partial_json": json.dumps({"command": command})[:9],
            },
        ),
    ]
    if closed:
        rest = json.dumps({"command": command})[9:]
        events += [
            event(
                "content_block_delta",
                index=0,
                delta={"type": "input_json_delta", "partial_json": rest},
            ),
            event("content_block_stop", index=0),
        ]
    return stream(*events, ends("tool_use" if closed else "max_tokens"), STOP)


@dataclass
class Route:
    """One provider's path: the custodian (and the budgeted one) in front of its stand-in."""

    name: str
    custodian: Custodian
    budgeted: dict[str, Custodian]  # one per adapter: each spends its whole budget
    standin: Any


def _custodians(
    stack: ExitStack, tmp: Path, name: str, env: dict[str, str]
) -> tuple[Custodian, dict[str, Custodian]]:
    base = {"CORRAL_AGENT_SPEC_JSON": json.dumps(AGENT), "CORRAL_SESSION_NAME": f"conf-{name}"}
    plain = stack.enter_context(running_custodian(base | env, tmp / f"{name}.log"))
    budget = base | env | {"CORRAL_BUDGET_TOKENS": str(BUDGET_TOKENS)}
    budgeted = {
        adapter: stack.enter_context(running_custodian(budget, tmp / f"{name}-{adapter}.log"))
        for adapter in ADAPTERS
    }
    return plain, budgeted


def _provider_env(entry: dict[str, Any]) -> dict[str, str]:
    return {"CORRAL_MODEL_PROVIDER": ModelProvider.model_validate(entry).to_json()}


def _start_route(stack: ExitStack, tmp: Path, name: str, upstream: Upstream) -> Route:
    env: dict[str, str]
    standin: Any = None
    if name == "anthropic":
        env = {"CORRAL_UPSTREAM_URL": upstream.url}
    elif name == "gateway":
        standin = GatewayStandIn(upstream.url, key=GATEWAY_KEY)
        running = serve_gateway_in_thread(standin)
        stack.callback(running.stop)
        entry = {"name": "gw", "type": "gateway", "baseUrl": running.url,
                 "authHeader": "authorization", "authScheme": "Bearer"}  # fmt: skip
        env = _provider_env(entry) | {"ANTHROPIC_API_KEY": GATEWAY_KEY}
    elif name == "bedrock":
        standin = BedrockStandIn(upstream=upstream.url, region="us-east-1")
        running_b = serve_bedrock(standin)
        stack.callback(running_b.stop)
        entry = {"name": "bedrock", "type": "bedrock", "region": "us-east-1",
                 "endpointUrl": running_b.url}  # fmt: skip
        env = _provider_env(entry) | {
            "AWS_ACCESS_KEY_ID": standin.access_key_id,
            "AWS_SECRET_ACCESS_KEY": standin.secret_access_key,
        }
    else:
        account = make_service_account()
        standin = VertexStandIn(upstream.url, account=account)
        running_v = serve_vertex_in_thread(standin)
        stack.callback(running_v.stop)
        key_file = tmp / "vertex-key.json"
        key_file.write_text(json.dumps(account.key))
        entry = {"name": "vertex", "type": "vertex", "project": standin.project,
                 "region": standin.region, "endpointUrl": running_v.url,
                 "tokenUrl": standin.token_url}  # fmt: skip
        env = _provider_env(entry) | {"CORRAL_GCP_KEY_FILE": str(key_file)}
    plain, budgeted = _custodians(stack, tmp, name, env)
    return Route(name, plain, budgeted, standin)


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Upstream, dict[str, Route]]]:
    tmp = tmp_path_factory.mktemp("providers")
    upstream = Upstream()
    with ExitStack() as stack:
        stack.callback(upstream.close)
        yield upstream, {name: _start_route(stack, tmp, name, upstream) for name in PROVIDERS}


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=sorted(ADAPTERS))
def adapter(request: pytest.FixtureRequest) -> type[StreamingEngine]:
    return ADAPTERS[request.param]


@dataclass
class Run:
    outcome: EngineOutcome
    seen: list[EngineEvent]
    bodies: list[dict[str, Any]]
    usage: dict[str, Any]

    def ends(self) -> list[MessageEnd]:
        return [e for e in self.seen if isinstance(e, MessageEnd)]


def _name_of(adapter: type[StreamingEngine]) -> str:
    return next(name for name, kind in ADAPTERS.items() if kind is adapter)


def _usage(custodian: Custodian) -> dict[str, Any]:
    usage: dict[str, Any] = custodian.usage()["usage"]  # type: ignore[assignment]
    return usage


async def _drive(
    routes: tuple[Upstream, dict[str, Route]],
    provider: str,
    adapter: type[StreamingEngine],
    root: Path,
    *responses: bytes,
    budgeted: bool = False,
) -> Run:
    upstream, by_name = routes
    route = by_name[provider]
    custodian = route.budgeted[_name_of(adapter)] if budgeted else route.custodian
    before = _usage(custodian)
    upstream.load(*responses)
    seen: list[EngineEvent] = []

    async def listen(event_: EngineEvent) -> None:
        seen.append(event_)

    settings = EngineSettings(
        base_url=custodian.url, api_key=custodian.credential, backoff_seconds=0.01
    )
    outcome = await adapter(settings).run(_job(root), Hooks(), listen)
    after = _usage(custodian)
    spent: dict[str, Any] = {k: after[k] - before.get(k, 0) for k in ("input", "output")}
    return Run(outcome, seen, list(upstream.bodies), spent)


async def test_a_text_answer_and_its_usage(
    routes: Any, provider: str, adapter: type[StreamingEngine], tmp_path: Path
) -> None:
    run = await _drive(routes, provider, adapter, tmp_path, answer("hello", input_tokens=11))
    assert run.outcome.status == "completed", run.outcome.error
    [end] = run.ends()
    assert end.message["content"] == [{"type": "text", "text": "hello"}]
    assert run.usage == {"input": 11, "output": 5}  # the provider's own numbers, translated
    assert run.bodies[0]["model"] == "corral-scripted"


async def test_a_streamed_tool_call_runs_with_its_input(
    routes: Any, provider: str, adapter: type[StreamingEngine], tmp_path: Path
) -> None:
    run = await _drive(
        routes, provider, adapter, tmp_path, tool_call("touch made-it"), answer("done")
    )
    assert run.outcome.status == "completed", run.outcome.error
    assert (tmp_path / "made-it").exists()
    assert run.ends()[0].message["content"][0]["input"] == {"command": "touch made-it"}
    result = run.bodies[1]["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_case"


async def test_a_tool_call_cut_off_at_max_tokens_never_runs(
    routes: Any, provider: str, adapter: type[StreamingEngine], tmp_path: Path
) -> None:
    run = await _drive(
        routes, provider, adapter, tmp_path, tool_call("touch ran", closed=False), answer("ok")
    )
    assert run.outcome.status == "completed", run.outcome.error
    assert not (tmp_path / "ran").exists()
    assert run.ends()[0].stop_reason == "max_tokens"
    ended = [e for e in run.seen if isinstance(e, ToolEnd)]
    assert len(ended) == 1 and "did not run" in ended[0].result.content


async def test_a_cut_mid_stream_is_an_api_error_that_keeps_the_partial_answer(
    routes: Any, provider: str, adapter: type[StreamingEngine], tmp_path: Path
) -> None:
    partial = b'event: content_block_delta\ndata: {"type": "content_block_delta", "ind'
    cut = stream(START, text_block(0, "Half an answer"), partial, whole=False)
    run = await _drive(routes, provider, adapter, tmp_path, cut)
    assert run.outcome.status == "failed"
    assert run.outcome.error is not None and run.outcome.error.type == "api_error"
    assert len(run.bodies) == 1  # text had been forwarded: no retry
    [end] = run.ends()
    assert end.message["content"] == [{"type": "text", "text": "Half an answer"}]


async def test_a_rate_limit_is_retried_and_the_turn_completes(
    routes: Any, provider: str, adapter: type[StreamingEngine], tmp_path: Path
) -> None:
    throttled = refusal(429, "rate_limit_error", "retry-after-ms: 200")
    began = time.monotonic()
    run = await _drive(routes, provider, adapter, tmp_path, throttled, answer("after a wait"))
    assert run.outcome.status == "completed", run.outcome.error
    assert len(run.bodies) == 2
    if provider != "bedrock":  # Bedrock's throttling answer carries no retry-after
        assert time.monotonic() - began >= 0.15


async def test_pause_turn_continues_the_turn(
    routes: Any, provider: str, adapter: type[StreamingEngine], tmp_path: Path
) -> None:
    paused = stream(START, text_block(0, "Still searching"), ends("pause_turn"), STOP)
    run = await _drive(routes, provider, adapter, tmp_path, paused, answer("found it"))
    assert run.outcome.status == "completed", run.outcome.error
    assert [e.stop_reason for e in run.ends()] == ["pause_turn", "end_turn"]
    assert run.bodies[1]["messages"][-1]["content"] == [{"type": "text", "text": "Still searching"}]


async def test_thinking_and_its_signature_are_kept_verbatim(
    routes: Any, provider: str, adapter: type[StreamingEngine], tmp_path: Path
) -> None:
    block = {"type": "thinking", "thinking": "", "signature": ""}
    thought = (
        event("content_block_start", index=0, content_block=block)
        + event("content_block_delta", index=0,
                delta={"type": "thinking_delta", "thinking": "Let me see."})
        + event("content_block_delta", index=0,
                delta={"type": "signature_delta", "signature": "c2lnbmVkLWJ5LXRoZS1tb2RlbA=="})
        + event("content_block_stop", index=0)
    )  # fmt: skip
    both = stream(START, thought, text_block(1, "seen"), ends("end_turn"), STOP)
    run = await _drive(routes, provider, adapter, tmp_path, both)
    assert run.outcome.status == "completed", run.outcome.error
    [end] = run.ends()
    assert end.message["content"][0] == {
        "type": "thinking",
        "thinking": "Let me see.",
        "signature": "c2lnbmVkLWJ5LXRoZS1tb2RlbA==",
    }


async def test_the_budget_is_enforced_from_the_providers_usage(
    routes: Any, provider: str, adapter: type[StreamingEngine], tmp_path: Path
) -> None:
    """The first answer reports more input than the whole budget: the custodian learns it
    from the provider's stream (translated or not) and refuses the next request, never
    retried; the tool the first answer asked for ran once."""
    over = tool_call("touch once", input_tokens=BUDGET_TOKENS + 2000)
    run = await _drive(routes, provider, adapter, tmp_path, over, answer("no"), budgeted=True)
    assert run.outcome.status == "failed"
    assert run.outcome.error is not None
    assert run.outcome.error.type == "budget_exceeded_error", run.outcome.error
    assert len(run.bodies) == 1 and (tmp_path / "once").exists()


@pytest.mark.parametrize("line_end", ["\r\n", "\r"], ids=["crlf", "lone-cr"])
async def test_every_kind_of_line_end_reads_alike(
    routes: Any, provider: str, adapter: type[StreamingEngine], tmp_path: Path, line_end: str
) -> None:
    events = (START + text_block(0, "ends differ") + ends("end_turn") + STOP).decode()
    body = events.replace("\n", line_end).encode()
    run = await _drive(routes, provider, adapter, tmp_path, stream(body))
    assert run.outcome.status == "completed", run.outcome.error
    [end] = run.ends()
    assert end.message["content"] == [{"type": "text", "text": "ends differ"}]


async def test_comments_pings_and_data_over_several_lines_read_alike(
    routes: Any, provider: str, adapter: type[StreamingEngine], tmp_path: Path
) -> None:
    delta = {"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": " and more"}}  # fmt: skip
    text = json.dumps(delta)
    split = text.index('"delta"')
    several = f"event: content_block_delta\ndata: {text[:split]}\ndata: {text[split:]}\n\n"
    start = event("content_block_start", index=0, content_block={"type": "text", "text": "one"})
    body = (
        b": a comment the reader skips\n\n" + START + event("ping") + start + several.encode()
        + event("content_block_stop", index=0) + ends("end_turn") + STOP
    )  # fmt: skip
    run = await _drive(routes, provider, adapter, tmp_path, stream(body))
    assert run.outcome.status == "completed", run.outcome.error
    [end] = run.ends()
    assert end.message["content"] == [{"type": "text", "text": "one and more"}]
