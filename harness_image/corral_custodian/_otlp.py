"""The trace relay: the harness's OTLP/HTTP exports leave the pod through its custodian.

    POST /otlp/v1/traces     one OTLP/HTTP export (protobuf or JSON), relayed as it came

The harness has no way out of the pod (no proxy, no proxy credential: docs/egress.md), so its
exporter posts here, with the pod-local credential like every other harness-facing path. The
custodian posts the same bytes, with their content type and content encoding, to the
collector's traces URL (CORRAL_OTLP_ENDPOINT plus `/v1/traces`, as OpenTelemetry appends it),
through the egress gateway with the Session's proxy credential when there is one (its httpx
client reads the proxy variables `main.use_egress_gateway` sets). Nothing of the spans is read.

The collector's status comes back to the exporter, which retries or drops as OpenTelemetry
says. The relay's own refusals say why: a body over `MAX_EXPORT_BYTES` is a 413, no collector a
404, one that cannot be reached a 502, one that does not answer in time a 504. Relayed and
failed batches are counted, and the log says when relaying starts failing and when it recovers
(not once per batch: an exporter tries every few seconds). docs/tracing.md.
"""

from __future__ import annotations

import logging

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ._proxy import BodyTooLarge, read_capped
from .settings import CustodianSettings

log = logging.getLogger("corral_custodian.otlp")

RELAY_PATH = "/otlp/v1/traces"
# A batch of the harness's spans is a few KiB; the SDK's own ceiling (64 MiB) is no bound here.
MAX_EXPORT_BYTES = 4 * 1024 * 1024
# Under the exporter's own 10 s, so it gets the relay's answer rather than a timeout of its own.
COLLECTOR_SECONDS = 5.0
COLLECTOR_TIMEOUT = httpx.Timeout(COLLECTOR_SECONDS, connect=3.0)
MAX_ANSWER_BYTES = 64 * 1024
# What a request keeps on its way to the collector (the bytes' meaning), and what an answer
# keeps on its way back (its meaning, and when to try again). The harness's own headers, its
# credential among them, stop here.
_FORWARDED = ("content-type", "content-encoding")
_ANSWERED = ("content-type", "retry-after", "x-corral-egress-reason")


class RelayCounts:
    """Batches relayed and failed since the start; `failing` while the last one failed."""

    def __init__(self) -> None:
        self.relayed = 0
        self.failed = 0
        self.failing = False

    def ok(self, url: str) -> None:
        self.relayed += 1
        if self.relayed == 1 or self.failing:
            log.info(
                "traces reach the collector at %s (%d batches relayed, %d failed)",
                url, self.relayed, self.failed,
            )  # fmt: skip
        self.failing = False

    def failure(self, reason: str) -> None:
        self.failed += 1
        if not self.failing:
            log.warning(
                "traces are not reaching the collector: %s (%d batches relayed, %d failed; "
                "further failures are counted until one gets through)",
                reason, self.relayed, self.failed,
            )  # fmt: skip
        self.failing = True


def _problem(status: int, error: str, reason: str) -> JSONResponse:
    return JSONResponse({"error": error, "reason": reason}, status_code=status)


async def relay(request: Request, url: str | None, counts: RelayCounts) -> Response:
    """Pass one export on to the collector at `url`; its answer, or the relay's refusal."""
    if url is None:
        return _problem(404, "no_collector", "this custodian has no trace collector configured")
    try:
        body = await read_capped(request, MAX_EXPORT_BYTES)
    except BodyTooLarge:
        return _problem(
            413, "too_large", f"the trace export is larger than {MAX_EXPORT_BYTES} bytes"
        )
    headers = {k: v for k in _FORWARDED if (v := request.headers.get(k))}
    try:
        # A client per export, as for hooks: an export comes every few seconds at most, and a
        # fresh client reads the proxy variables of this process (the gateway's, when set).
        async with (
            httpx.AsyncClient(timeout=COLLECTOR_TIMEOUT, follow_redirects=False) as http,
            http.stream("POST", url, content=body, headers=headers) as answer,
        ):
            data = b""
            async for chunk in answer.aiter_bytes():
                data += chunk
                if len(data) >= MAX_ANSWER_BYTES:  # an answer is a status, not a payload
                    data = data[:MAX_ANSWER_BYTES]
                    break
    except httpx.TimeoutException:
        counts.failure("the collector did not answer in time")
        return _problem(
            504,
            "collector_timeout",
            f"the trace collector did not answer in {COLLECTOR_SECONDS:g} s",
        )
    except httpx.HTTPError as e:
        reason = f"the trace collector is unreachable: {type(e).__name__}: {e}"
        counts.failure(reason)
        return _problem(502, "collector_unreachable", reason)
    if 200 <= answer.status_code < 300:
        counts.ok(url)
    else:
        counts.failure(f"the collector answered {answer.status_code}")
    kept = {k: v for k in _ANSWERED if (v := answer.headers.get(k))}
    return Response(data, status_code=answer.status_code, headers=kept)


def add_otlp_routes(app: FastAPI, settings: CustodianSettings) -> None:
    counts = RelayCounts()

    @app.post(RELAY_PATH)
    async def traces(request: Request) -> Response:
        return await relay(request, settings.otlp_traces_url, counts)
