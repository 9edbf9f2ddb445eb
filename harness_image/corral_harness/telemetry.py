"""Traces of a run: one span for the turn, one per model call, one per tool call.

The spans follow OpenTelemetry's GenAI semantic conventions (`gen_ai.operation.name`
`invoke_agent` / `chat` / `execute_tool`, `gen_ai.request.model`, `gen_ai.usage.*`,
`gen_ai.tool.*`) and carry the run id (`run.id`) the operator minted and sent on the admission;
the run's trace id is derived from it, so anything else that traces the same run id (the
operator, the custodian) lands in the same trace. This layer names runs, steps, tools and
tokens, nothing of the product.

Cost: nothing of OpenTelemetry is imported unless tracing is configured, so the harness's start
path and a step without tracing pay one attribute lookup. Configured means:

- `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (a URL) or `OTEL_EXPORTER_OTLP_ENDPOINT` (a base, to
  which `/v1/traces` is appended) is set: spans leave over OTLP/HTTP (a batch processor; the
  standard `OTEL_*` variables tune it). In a sandbox pod the URL is the custodian's relay
  (`/otlp/v1/traces`): the harness has no way out of the pod, its custodian does. An endpoint
  on the custodian's own origin gets the custodian credential as its bearer token, read from
  the credential file (`use_custodian`), never from a variable and never sent elsewhere; or
- an in-process exporter was installed (`install(exporter)`, e.g. the SDK's in-memory one).

docs/tracing.md.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
RUN_ID_HEADER = "X-Corral-Run-Id"
SCOPE = "corral.harness"

# The trace id the next root span takes (a run's trace id is derived from its run id).
_next_trace_id: ContextVar[int | None] = ContextVar("corral_next_trace_id", default=None)


def traces_endpoint(env: Mapping[str, str]) -> str | None:
    """Where spans go, by OpenTelemetry's rule: the traces URL, else the base + `/v1/traces`."""
    if url := env.get(TRACES_ENDPOINT_ENV, "").strip():
        return url
    if base := env.get(ENDPOINT_ENV, "").strip():
        return base.rstrip("/") + "/v1/traces"
    return None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return (
        scheme,
        (parts.hostname or "").lower(),
        parts.port or {"http": 80, "https": 443}.get(scheme),
    )


def custodian_headers(
    endpoint: str, custodian_url: str | None, credential_file: Path | None
) -> dict[str, str]:
    """The exporter's authorization: the custodian credential for an endpoint on the
    custodian's origin (its relay), nothing for any other (a collector never sees it)."""
    if custodian_url is None or credential_file is None:
        return {}
    if _origin(endpoint) != _origin(custodian_url):
        return {}
    credential = credential_file.read_text().strip()
    if not credential:
        raise ValueError(f"the custodian credential file {credential_file} is empty")
    return {"authorization": f"Bearer {credential}"}


def trace_id_of(run_id: str) -> int:
    """The run's 128-bit trace id: the same run id gives the same trace in every process."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big") or 1


class RunTrace:
    """The spans of one run (a submission's turn). The no-op base is what an unconfigured
    harness uses; `_OtelRunTrace` records."""

    def model_call(self, step: int) -> None:
        """A model request is about to go out."""

    def model_done(self, input_tokens: int, output_tokens: int, finish_reason: str) -> None:
        """The model call's answer came in (or was cut)."""

    def tool_start(self, call_id: str, name: str) -> None:
        """A tool call started (it may still be blocked)."""

    def tool_end(self, call_id: str, *, error: str | None = None) -> None:
        """A tool call ended; `error` names why it failed, if it did."""

    def end(self, status: str, *, error_type: str | None, tokens: int, steps: int) -> None:
        """The run settled."""


OFF = RunTrace()


class _OtelRunTrace(RunTrace):
    def __init__(self, tracer: Any, run_id: str, conversation: str, model: str) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer = tracer
        self._model = model
        token = _next_trace_id.set(trace_id_of(run_id))
        try:
            self._run = tracer.start_span(
                "invoke_agent",
                kind=trace.SpanKind.INTERNAL,
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.request.model": model,
                    "gen_ai.conversation.id": conversation,
                    "run.id": run_id,
                },
            )
        finally:
            _next_trace_id.reset(token)
        self._context = trace.set_span_in_context(self._run)
        self._call: Any = None
        self._tools: dict[str, Any] = {}

    def model_call(self, step: int) -> None:
        if self._call is not None:
            self._call.end()
        self._call = self._tracer.start_span(
            f"chat {self._model}",
            context=self._context,
            kind=self._trace.SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "anthropic",
                "gen_ai.request.model": self._model,
                "run.step": step,
            },
        )

    def model_done(self, input_tokens: int, output_tokens: int, finish_reason: str) -> None:
        call, self._call = self._call, None
        if call is None:
            return
        call.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        call.set_attribute("gen_ai.usage.output_tokens", output_tokens)
        call.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        call.end()

    def tool_start(self, call_id: str, name: str) -> None:
        self._tools[call_id] = self._tracer.start_span(
            f"execute_tool {name}",
            context=self._context,
            kind=self._trace.SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": call_id,
            },
        )

    def tool_end(self, call_id: str, *, error: str | None = None) -> None:
        span = self._tools.pop(call_id, None)
        if span is None:
            return
        if error:
            span.set_attribute("error.type", error)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.end()

    def end(self, status: str, *, error_type: str | None, tokens: int, steps: int) -> None:
        for span in [*self._tools.values(), *([self._call] if self._call else [])]:
            span.set_attribute("error.type", "did_not_finish")
            span.end()
        self._tools.clear()
        self._call = None
        self._run.set_attribute("run.status", status)
        self._run.set_attribute("run.steps", steps)
        self._run.set_attribute("run.tokens", tokens)
        if error_type:
            self._run.set_attribute("error.type", error_type)
            self._run.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        self._run.end()


class Tracing:
    """The process's tracer: None until configured (then an SDK TracerProvider)."""

    def __init__(self) -> None:
        self.provider: Any = None
        self._tracer: Any = None
        self._checked = False
        self._lock = threading.Lock()  # the server preloads in a thread (`preload`)
        self._custodian_url: str | None = None
        self._credential_file: Path | None = None

    def use_custodian(self, url: str | None, credential_file: Path | None) -> None:
        """The harness's custodian, whose relay gets the credential (before the first span:
        the server calls it as it starts, a pooled harness once adopted)."""
        self._custodian_url, self._credential_file = url, credential_file

    def wanted(self) -> bool:
        return traces_endpoint(os.environ) is not None

    def configured(self) -> bool:
        if not self._checked:
            with self._lock:
                if not self._checked and self.wanted():
                    try:
                        self._install_otlp()
                    except Exception:  # tracing must never stop a turn
                        log.exception("OTLP tracing could not be set up; running without it")
                self._checked = True
        return self._tracer is not None

    def run(self, run_id: str, conversation: str, model: str) -> RunTrace:
        if not self.configured():
            return OFF
        try:
            return _OtelRunTrace(self._tracer, run_id, conversation, model)
        except Exception:
            log.exception("could not start the run's span")
            return OFF

    def install(self, exporter: Any, *, batch: bool = False) -> None:
        """Send spans to `exporter` (an SDK SpanExporter), in this process."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        provider = TracerProvider(
            resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", SCOPE)}),
            id_generator=_RunIdGenerator(),
        )
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
        self.provider = provider
        self._tracer = provider.get_tracer(SCOPE)
        self._checked = True

    def _install_otlp(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = traces_endpoint(os.environ)
        assert endpoint is not None  # `wanted`
        headers = custodian_headers(endpoint, self._custodian_url, self._credential_file)
        # The rest (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION) from the OTEL_* env.
        self.install(OTLPSpanExporter(endpoint=endpoint, headers=headers or None), batch=True)
        via = " (the custodian's relay)" if headers else ""
        log.info("traces go over OTLP to %s%s", endpoint, via)

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def _RunIdGenerator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunIdGenerator(RandomIdGenerator):
        """A root span started for a run takes the run's trace id."""

        def generate_trace_id(self) -> int:
            wanted = _next_trace_id.get()
            return wanted if wanted is not None else super().generate_trace_id()

    return RunIdGenerator()


TRACING = Tracing()
