"""Traces through the wire: the real harness process exports its spans over OTLP/HTTP to a
receiver this test runs (docs/tracing.md)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral_harness.telemetry import trace_id_of

from ._rig import AGENT, Harness, Model, serve

pytestmark = pytest.mark.timeout(60)


class Collector:
    """An OTLP/HTTP trace receiver: keeps every span it is sent, attributes decoded."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/v1/traces", self._traces, methods=["POST"])])

    async def _traces(self, request: Request) -> Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.body())
        for resource_spans in export.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        {
                            "name": span.name,
                            "trace_id": int.from_bytes(span.trace_id, "big"),
                            "span_id": span.span_id,
                            "parent": span.parent_span_id,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                        }
                    )
        return Response(b"", media_type="application/x-protobuf")

    def wait(self, name: str, timeout: float = 10) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [s for s in self.spans if s["name"] == name]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no {name} span; got {[s['name'] for s in self.spans]}")


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    receiver = Collector()
    url, server = serve(receiver.app)
    yield receiver, url
    server.should_exit = True


def test_spans_of_the_turn_each_model_call_and_each_tool_reach_the_collector(
    fresh_harness: Harness, model: Model, conv: str, collector: tuple[Collector, str]
) -> None:
    receiver, url = collector
    fresh_harness.extra_env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=url, OTEL_BSP_SCHEDULE_DELAY="50", OTEL_SERVICE_NAME="harness"
    )
    fresh_harness.start()
    model.script(
        conv,
        [
            {
                "tool_use": {"name": "bash", "input": {"command": "echo hi"}},
                "usage": {"input_tokens": 40, "output_tokens": 7},
            },
            {"text": "done", "usage": {"input_tokens": 60, "output_tokens": 3}},
        ],
    )
    run_id = "session-uid-1.3"
    admitted = fresh_harness.admit(conv, "trace me", runId=run_id)
    assert fresh_harness.wait_settled(conv, admitted["submissionId"])["status"] == "completed"

    (run,) = receiver.wait("invoke_agent")
    chats = receiver.wait("chat corral-scripted")
    (tool,) = receiver.wait("execute_tool bash")
    # One trace, derived from the run id the operator minted, for every span of the run.
    assert {s["trace_id"] for s in [run, *chats, tool]} == {trace_id_of(run_id)}
    assert all(s["parent"] == run["span_id"] for s in [*chats, tool])
    assert run["attributes"]["run.id"] == run_id
    assert run["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert run["attributes"]["gen_ai.conversation.id"] == conv
    assert run["attributes"]["run.status"] == "completed" and run["attributes"]["run.steps"] == 1
    assert len(chats) == 2
    usage = sorted(
        (
            c["attributes"]["gen_ai.usage.input_tokens"],
            c["attributes"]["gen_ai.usage.output_tokens"],
        )
        for c in chats
    )
    assert usage[0][1] in (3, 7) and {u[1] for u in usage} == {3, 7}
    assert all(c["attributes"]["gen_ai.request.model"] == "corral-scripted" for c in chats)
    assert all(c["attributes"]["gen_ai.operation.name"] == "chat" for c in chats)
    assert tool["attributes"]["gen_ai.tool.name"] == "bash"
    assert tool["attributes"]["gen_ai.operation.name"] == "execute_tool"
    assert tool["attributes"]["gen_ai.tool.call.id"]


def test_a_failed_run_marks_its_span_with_the_error_type(
    fresh_harness: Harness, model: Model, conv: str, collector: tuple[Collector, str]
) -> None:
    receiver, url = collector
    fresh_harness.extra_env.update(OTEL_EXPORTER_OTLP_ENDPOINT=url, OTEL_BSP_SCHEDULE_DELAY="50")
    fresh_harness.start()
    model.script(conv, [{"tool_use": {"name": "bash", "input": {"command": "echo 1"}}}, "no"])
    spec = {**AGENT, "limits": {"maxStepsPerTurn": 1}}
    model.script(
        conv,
        [{"tool_uses": [{"name": "bash", "input": {"command": f"echo {i}"}} for i in range(2)]}],
    )
    admitted = fresh_harness.admit(conv, "loop", spec=spec, runId="run-2")
    assert fresh_harness.wait_settled(conv, admitted["submissionId"])["error"]["type"] == "runaway"
    (run,) = receiver.wait("invoke_agent")
    assert run["attributes"]["error.type"] == "runaway"


def test_without_an_endpoint_the_harness_imports_no_opentelemetry() -> None:
    # The start path stays lean: the server module, a turn's module and the engine load
    # neither the OpenTelemetry SDK nor its exporter unless tracing is configured. (FastAPI
    # itself imports the small `opentelemetry` API package; that is not ours to avoid.)
    code = (
        "HEAVY = ('opentelemetry.sdk', 'opentelemetry.exporter', 'opentelemetry.proto');"
        "import sys; import corral_harness.main, corral_harness.server, corral_harness.turn;"
        "from corral_harness.telemetry import TRACING;"
        "assert TRACING.run('r', 'c', 'm').__class__.__name__ == 'RunTrace';"
        "print(sorted(m for m in sys.modules if m.startswith(HEAVY)))"
    )
    env = {"PATH": str(Path(sys.executable).parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
