"""An OTLP/HTTP trace collector for the tests: a real HTTP server on a loopback address of the
test's choosing that keeps every export it is sent (path, headers, raw body) and every span in
it, attributes decoded; it answers with the status the test sets."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral_dev.ports import free_port

PROTOBUF = "application/x-protobuf"


@dataclass
class Export:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Collector:
    spans: list[dict[str, Any]] = field(default_factory=list)
    exports: list[Export] = field(default_factory=list)
    status: int = 200
    answer_headers: dict[str, str] = field(default_factory=dict)
    url: str = ""

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/traces", self._traces, methods=["POST"])])

    async def _traces(self, request: Request) -> Response:
        body = await request.body()
        self.exports.append(Export(request.url.path, dict(request.headers), body))
        if request.headers.get("content-type", "").startswith(PROTOBUF):
            raw = gzip.decompress(body) if request.headers.get("content-encoding") else body
            export = ExportTraceServiceRequest()
            export.ParseFromString(raw)
            for resource_spans in export.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(_span(s) for s in scope_spans.spans)
        return Response(
            b"", status_code=self.status, media_type=PROTOBUF, headers=self.answer_headers
        )

    def wait(self, name: str, timeout: float = 15) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [s for s in self.spans if s["name"] == name]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no {name} span; got {[s['name'] for s in self.spans]}")


def _span(span: Any) -> dict[str, Any]:
    return {
        "name": span.name,
        "trace_id": int.from_bytes(span.trace_id, "big"),
        "span_id": span.span_id,
        "parent": span.parent_span_id,
        "attributes": {a.key: _value(a.value) for a in span.attributes},
    }


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@contextmanager
def running_collector(host: str = "127.0.0.1") -> Iterator[Collector]:
    """A collector listening on `host` (a free port); `url` is its OTLP base URL."""
    collector = Collector()
    port = free_port(host)
    server = uvicorn.Server(
        uvicorn.Config(collector.app(), host=host, port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the collector did not start"
        time.sleep(0.01)
    collector.url = f"http://{host}:{port}"
    try:
        yield collector
    finally:
        server.should_exit = True
        thread.join(5)


def one_span_export(name: str = "relayed", trace_id: int = 7) -> bytes:
    """A serialised OTLP export of one span, as an exporter would post it."""
    span = Span(
        name=name,
        trace_id=trace_id.to_bytes(16, "big"),
        span_id=(1).to_bytes(8, "big"),
        attributes=[KeyValue(key="run.id", value=AnyValue(string_value="r-1"))],
    )
    export = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])]
    )
    return bytes(export.SerializeToString())
