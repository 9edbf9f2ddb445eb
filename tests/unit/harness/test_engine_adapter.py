"""Both engine adapters against the seam: hooks, steering, aborts, and the order of events.

Every test runs once per adapter (`sdk`: the official SDK, the reference; `lean`: httpx and the
project's stream reader). The engine runs in this process against the scripted model over
loopback (real HTTP); the hooks are small recording objects written for these tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from anthropic._constants import ANTHROPIC_API_VERSION

from corral_common.catalog import resolve_model
from corral_harness.engine._loop import EngineSettings, StreamingEngine
from corral_harness.engine.anthropic_engine import AnthropicEngine
from corral_harness.engine.lean_engine import LeanEngine
from corral_harness.engine.messages import for_provider
from corral_harness.engine.seam import (
    ALLOW,
    EngineEvent,
    EngineJob,
    EngineTool,
    RequestPlan,
    StopRun,
    ToolGate,
)
from corral_harness.paths import GrantedRoot
from corral_harness.ports import ToolCall
from corral_harness.tools import WorkingTools
from tests._scripted import ScriptedServer, unmarked

pytestmark = pytest.mark.timeout(30)

ADAPTERS: dict[str, type[StreamingEngine]] = {"sdk": AnthropicEngine, "lean": LeanEngine}


@pytest.fixture(params=sorted(ADAPTERS))
def adapter(request: pytest.FixtureRequest) -> type[StreamingEngine]:
    """The engine adapter under test: each test of this module runs over both (against the
    `scripted` model server, reset for each test)."""
    return ADAPTERS[request.param]


class RecordingHooks:
    def __init__(self, engine: StreamingEngine | None = None) -> None:
        self.asked: list[str] = []
        self.requests = 0
        self.gates: dict[str, ToolGate] = {}
        self.stop_after: int | None = None
        self.end_at_step: int | None = None
        self.steer_at_request: dict[int, str] = {}
        self.engine = engine
        self.log: list[str] = []

    async def convert_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return messages

    async def before_request(self, messages: list[dict[str, Any]]) -> RequestPlan:
        self.requests += 1
        self.log.append(f"request {self.requests}")
        if self.stop_after is not None and self.requests > self.stop_after:
            raise StopRun("the window is full")
        return RequestPlan("system prompt", for_provider(messages))

    async def before_tool_call(self, call: ToolCall) -> ToolGate:
        self.asked.append(call.name)
        self.log.append(f"ask {call.input.get('command', call.name)}")
        return self.gates.get(call.input.get("command", ""), ALLOW)

    def ends_run(self, step: int) -> bool:
        return step == self.end_at_step


def _job(conv: str, root: Path) -> EngineJob:
    tools = WorkingTools(GrantedRoot(root))

    def runner(name: str) -> Any:
        return lambda args: tools.run(name, args)

    engine_tools = [EngineTool(spec, runner(spec.name)) for spec in tools.specs()]
    return EngineJob(conv, resolve_model("corral-scripted"), "low", "", engine_tools, [], "go", 500)


def _engine(adapter: type[StreamingEngine], scripted: ScriptedServer) -> StreamingEngine:
    return adapter(EngineSettings(base_url=scripted.url, backoff_seconds=0.01))


def _script(scripted: ScriptedServer, conv: str, replies: list[Any]) -> None:
    scripted.load({"conversations": {conv: replies}})


def _bash(*commands: str) -> dict[str, Any]:
    return {"tool_uses": [{"name": "bash", "input": {"command": c}} for c in commands]}


async def test_events_and_hooks_come_in_the_seams_order(
    adapter: type[StreamingEngine], scripted: ScriptedServer, tmp_path: Path
) -> None:
    _script(scripted, "order", [_bash("echo 1", "echo 2"), "done"])
    engine = _engine(adapter, scripted)
    hooks = RecordingHooks()
    seen: list[str] = []

    async def listen(event: EngineEvent) -> None:
        name = event.type
        if name in ("tool_start", "tool_end"):
            name += " " + event.call.input["command"]  # type: ignore[union-attr]
        seen.append(name)
        hooks.log.append(name)

    outcome = await engine.run(_job("order", tmp_path), hooks, listen)
    assert outcome.status == "completed" and outcome.steps == 1
    assert hooks.log == [
        "request 1",
        "message_end",
        "tool_start echo 1",
        "ask echo 1",
        "tool_end echo 1",
        "tool_start echo 2",
        "ask echo 2",
        "tool_end echo 2",
        "step_boundary",
        "request 2",
        "message_end",
    ]
    sent = scripted.requests("order")
    assert sent[0]["body"]["system"] == "system prompt"
    assert sent[0]["body"]["thinking"] == {"type": "disabled"}  # max_tokens 500 leaves no room


async def test_a_gate_that_aborts_leaves_later_calls_unanswered(
    adapter: type[StreamingEngine], scripted: ScriptedServer, tmp_path: Path
) -> None:
    _script(scripted, "gate", [_bash("echo a", "touch blocked", "touch never")])
    hooks = RecordingHooks()
    hooks.gates["touch blocked"] = ToolGate(block="a hook denied this", abort=True)
    ends: list[tuple[str, str]] = []

    async def listen(event: EngineEvent) -> None:
        if event.type == "tool_end":
            ends.append((event.call.input["command"], event.result.content))

    outcome = await _engine(adapter, scripted).run(_job("gate", tmp_path), hooks, listen)
    assert outcome.status == "aborted"
    assert [c.input["command"] for c in outcome.unanswered] == ["touch never"]
    assert ends == [("echo a", "a\n"), ("touch blocked", "a hook denied this")]
    assert not (tmp_path / "blocked").exists() and not (tmp_path / "never").exists()


async def test_steering_adds_a_user_message_before_the_next_request(
    adapter: type[StreamingEngine], scripted: ScriptedServer, tmp_path: Path
) -> None:
    _script(scripted, "steer", [_bash("echo 1"), "done"])
    engine = _engine(adapter, scripted)

    async def listen(event: EngineEvent) -> None:
        if event.type == "tool_end":
            engine.steer("also check the tests")

    outcome = await engine.run(_job("steer", tmp_path), RecordingHooks(), listen)
    assert outcome.status == "completed"
    second = scripted.requests("steer")[1]["body"]
    last = unmarked(second["messages"][-1]["content"])  # the prompt-cache marker left out
    assert last[0]["type"] == "tool_result"
    assert last[-1] == {"type": "text", "text": "also check the tests"}


async def test_ends_run_and_stop_run(
    adapter: type[StreamingEngine], scripted: ScriptedServer, tmp_path: Path
) -> None:
    _script(scripted, "ends", [_bash("echo 1"), _bash("echo 2"), "done"])
    hooks = RecordingHooks()
    hooks.end_at_step = 1
    outcome = await _engine(adapter, scripted).run(_job("ends", tmp_path), hooks, _ignore)
    assert outcome.status == "ended_by_hook" and hooks.requests == 1

    _script(scripted, "stop", [_bash("echo 1"), "done"])
    hooks = RecordingHooks()
    hooks.stop_after = 1
    outcome = await _engine(adapter, scripted).run(_job("stop", tmp_path), hooks, _ignore)
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error.message == "the window is full"
    assert len(scripted.requests("stop")) == 1


async def test_abort_at_tool_start_runs_no_call(
    adapter: type[StreamingEngine], scripted: ScriptedServer, tmp_path: Path
) -> None:
    _script(scripted, "early", [_bash("touch one", "touch two")])
    engine = _engine(adapter, scripted)

    async def listen(event: EngineEvent) -> None:
        if event.type == "tool_start":
            engine.abort()  # a runaway watch trips at tool_start

    outcome = await engine.run(_job("early", tmp_path), RecordingHooks(), listen)
    assert outcome.status == "aborted"
    assert [c.input["command"] for c in outcome.unanswered] == ["touch one", "touch two"]
    assert not (tmp_path / "one").exists()


async def _ignore(event: EngineEvent) -> None:
    return None


async def test_an_abort_while_the_request_is_prepared_sends_no_request(
    adapter: type[StreamingEngine], scripted: ScriptedServer, tmp_path: Path
) -> None:
    """The abort lands while the context is assembled (a workspace survey through the exec
    service can take that long): the request must not start, or the abort waits for it."""
    _script(scripted, "prepared", [{"text": "slow", "delay": 20}])
    engine = _engine(adapter, scripted)

    class AbortWhilePreparing(RecordingHooks):
        async def before_request(self, messages: list[dict[str, Any]]) -> RequestPlan:
            plan = await super().before_request(messages)
            engine.abort()
            return plan

    outcome = await engine.run(_job("prepared", tmp_path), AbortWhilePreparing(), _ignore)
    assert outcome.status == "aborted"
    assert not scripted.requests("prepared")


@pytest.mark.parametrize(("should_retry", "attempts"), [("false", 1), ("true", 3)])
async def test_the_servers_should_retry_header_decides_a_retry(
    adapter: type[StreamingEngine], tmp_path: Path, should_retry: str, attempts: int
) -> None:
    """A 429 is retried, unless the server says `x-should-retry: false` (as the custodian does
    for a spent budget: another try would only be refused again). A budget refusal itself is
    never retried, whatever the header (test_engine_streams.py)."""
    import http.server
    import json
    import threading

    seen: list[str] = []

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            seen.append(self.path)
            body = json.dumps(
                {"type": "error", "error": {"type": "rate_limit_error", "message": "spent"}}
            ).encode()
            self.send_response(429)
            self.send_header("content-type", "application/json")
            self.send_header("x-should-retry", should_retry)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        engine = adapter(EngineSettings(base_url=url, backoff_seconds=0.01))
        outcome = await engine.run(_job("spent", tmp_path), RecordingHooks(), _ignore)
    finally:
        server.shutdown()
    assert outcome.status == "failed"
    assert outcome.error is not None and "spent" in outcome.error.message
    assert len(seen) == attempts


@pytest.mark.parametrize(("cut_after_text", "attempts"), [(False, 3), (True, 1)])
async def test_a_connection_broken_mid_stream_is_retried_only_before_content(
    adapter: type[StreamingEngine], tmp_path: Path, cut_after_text: bool, attempts: int
) -> None:
    """The server sends part of a 200 stream and closes the connection mid-body: a
    `connection_error`, retried while nothing was forwarded, never after."""
    import socket
    import threading

    events = [
        b'event: message_start\ndata: {"type": "message_start", "message": {"usage": '
        b'{"input_tokens": 3, "output_tokens": 1}}}\n\n'
    ]
    if cut_after_text:
        events.append(
            b'event: content_block_start\ndata: {"type": "content_block_start", "index": 0, '
            b'"content_block": {"type": "text", "text": "half"}}\n\n'
        )
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    accepted: list[int] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536)
                accepted.append(1)
                conn.sendall(head + body)  # and close: the chunked body never ends

    threading.Thread(target=serve, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        engine = adapter(EngineSettings(base_url=url, backoff_seconds=0.01))
        outcome = await engine.run(_job("cut", tmp_path), RecordingHooks(), _ignore)
    finally:
        listener.close()
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error.type == "connection_error"
    assert len(accepted) == attempts


async def test_the_run_id_and_api_version_go_with_every_model_request(
    adapter: type[StreamingEngine], scripted: ScriptedServer, tmp_path: Path
) -> None:
    _script(scripted, "run-id", [_bash("echo 1"), "done"])
    job = _job("run-id", tmp_path)
    job.run_id = "run-42"
    outcome = await _engine(adapter, scripted).run(job, RecordingHooks(), _ignore)
    assert outcome.status == "completed"
    sent = [r["headers"] for r in scripted.requests("run-id")]
    assert [h.get("x-corral-run-id") for h in sent] == ["run-42", "run-42"]
    # Both adapters speak the API version of the installed SDK (the reference).
    assert all(h.get("anthropic-version") == ANTHROPIC_API_VERSION for h in sent)
