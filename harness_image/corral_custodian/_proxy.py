"""The model proxy: the harness's ANTHROPIC_BASE_URL points here, and only here is the key.

Each request is checked before anything goes upstream: its size, its headers, its body (one
JSON object, no key twice, only the fields and blocks the allowlist names: `model_rules`), the
model (the Agent's or the Session's override only), max_tokens (clamped), the number of
requests in flight, and the budget, against which the request's worst case (its input estimate
and all of its max_tokens, at catalog prices) is reserved. What goes to the upstream Messages
API is the custodian's own serialisation of the object it checked, never the caller's bytes,
with the custodian's key and only the `anthropic-version` and allowed `anthropic-beta` headers;
a streamed answer passes through chunk by chunk, byte for byte, as it arrives, while a parser
observes it for usage. When the answer ends, however it ends (completed, upstream error, the
caller gone, the custodian stopping), the reservation is settled to the usage the answer
reported, or, when that cannot be read, to the whole reservation (`budget.stream_charge`).
Refusals are Anthropic-style error bodies; `x-should-retry` says whether the SDK may try again
(a full concurrency slot: yes; a budget, model, shape or size refusal: no).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from corral_api.freeze import FROZEN_ERROR

from ._live import LiveError, LiveState
from ._usage_store import UsageStore
from .budget import (
    CallUsage,
    Charge,
    StreamUsageReader,
    body_charge,
    held_by,
    reservation_for,
    reservation_refusal,
    stream_charge,
)
from .model_rules import ModelRefusal, check_request, encode_body, forwarded_headers, parse_body
from .providers import (
    ModelRequest,
    ProviderRefusal,
    StreamBroken,
    UpstreamAnswer,
    build_provider,
)
from .settings import CustodianSettings

log = logging.getLogger("corral_custodian.proxy")


def anthropic_error(status: int, kind: str, message: str, retry: bool = False) -> JSONResponse:
    return JSONResponse(
        {"type": "error", "error": {"type": kind, "message": message}},
        status_code=status,
        headers={"x-should-retry": "true" if retry else "false"},
    )


class BodyTooLarge(Exception):
    pass


async def read_capped(request: Request, limit: int) -> bytes:
    """The request body, refusing more than `limit` bytes without reading past it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


class _Slot:
    """One request's hold on the budget and on a concurrency slot, released exactly once."""

    def __init__(self, proxy: ModelProxy, ticket: int) -> None:
        self._proxy = proxy
        self._ticket = ticket
        self._done = False

    def settle(self, actual: CallUsage | None) -> None:
        if self._done:
            return
        self._done = True
        self._proxy._in_flight -= 1
        self._proxy._usage.settle(self._ticket, actual)

    def charge(self, charge: Charge) -> None:
        """Settle to what an answer is charged, saying why when it is not its own usage."""
        if charge.why and not self._done:
            log.warning("model answer charged: %s", charge.why)
        self.settle(charge.call)


class _RelayedStream(StreamingResponse):
    """Pass the provider's SSE stream through, and settle when it ends however it ends.

    Starlette's StreamingResponse leaves the body iterator unfinished when the client goes,
    so the settlement would wait for garbage collection; this one watches for the disconnect
    itself and settles in `finally`.
    """

    def __init__(
        self,
        upstream: UpstreamAnswer,
        reader: StreamUsageReader,
        on_end: Callable[[bool], None],
    ) -> None:
        super().__init__(
            _never(), status_code=upstream.status_code, headers=upstream.headers,
            media_type="text/event-stream",
        )  # fmt: skip
        self._upstream = upstream
        self._reader = reader
        self._on_end = on_end  # called with whether the upstream's stream ended (or broke)
        self._upstream_ended = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(self._watch(receive))
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            pump.cancel()
            watch.cancel()
            self._reader.close()
            # Synchronous: it happens even if this task is being cancelled.
            self._on_end(self._upstream_ended)
            await asyncio.gather(pump, watch, return_exceptions=True)
            await self._upstream.aclose()

    async def _pump(self, send: Send) -> None:
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code,
                 "headers": self.raw_headers}
            )  # fmt: skip
            try:
                async for chunk in self._upstream.stream():
                    self._reader.feed(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                self._upstream_ended = True
            except (httpx.HTTPError, StreamBroken) as e:
                self._upstream_ended = True
                event = {"type": "error", "error": {"type": "api_error",
                         "message": f"the model upstream broke off the stream: {e}"}}  # fmt: skip
                # It opens with a blank line: after a drop mid-line the partial line ends
                # there, as an event of its own, and never joins this one.
                payload = f"\n\nevent: error\ndata: {json.dumps(event)}\n\n".encode()
                await send({"type": "http.response.body", "body": payload, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            return  # the client is gone

    @staticmethod
    async def _watch(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass


def _refused(refusal: ModelRefusal) -> JSONResponse:
    log.warning("model request refused: %s", refusal.message)
    return anthropic_error(refusal.status, refusal.kind, refusal.message)


async def _never() -> Any:
    return
    yield  # an empty async generator: _RelayedStream sends its own body


class ModelProxy:
    def __init__(self, settings: CustodianSettings, live: LiveState, usage: UsageStore) -> None:
        self._settings = settings
        self._provider = build_provider(settings)
        self._live = live
        self._usage = usage
        self._in_flight = 0
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0))

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def aclose(self) -> None:
        await self._provider.aclose()
        await self._http.aclose()

    async def messages(self, request: Request) -> Response:
        headers = forwarded_headers(request.headers.items())
        if isinstance(headers, ModelRefusal):
            return _refused(headers)
        limit = self._settings.max_body_bytes
        try:
            raw = await read_capped(request, limit)
        except BodyTooLarge:
            return anthropic_error(
                413, "request_too_large", f"the request body is larger than {limit} bytes"
            )
        body = parse_body(raw)
        if isinstance(body, ModelRefusal):
            return _refused(body)
        try:
            loaded = await self._live.load()
        except LiveError as e:
            if e.retryable:
                return anthropic_error(503, "api_error", str(e), retry=True)
            return anthropic_error(403, "permission_error", str(e))
        if loaded.frozen_by is not None:
            held = f"the session is {loaded.frozen_by.describe()}; no model call until it is lifted"
            log.warning("model request refused: %s", held)
            return anthropic_error(403, FROZEN_ERROR, held)
        facts = loaded.facts
        checked = check_request(facts, body)
        if isinstance(checked, ModelRefusal):
            return _refused(checked)
        # What goes upstream is what was checked, as the custodian writes it: a body the
        # provider would read otherwise than the check did cannot pass in the caller's bytes.
        raw = encode_body(checked.body)

        cap = self._settings.max_in_flight
        if self._in_flight >= cap:
            return anthropic_error(
                429, "rate_limit_error",
                f"{self._in_flight} model requests are already in flight (the limit is {cap})",
                retry=True,
            )  # fmt: skip
        ask = reservation_for(checked.model, len(raw), checked.max_tokens)
        refusal = reservation_refusal(
            facts.budget, self._usage.totals, self._usage.reserved, self._usage.carved,
            held_by(ask),
        )  # fmt: skip
        if refusal is not None:
            return anthropic_error(429, "budget_exceeded_error", refusal)
        # No await between the check above and this: nothing else can reserve in between.
        self._in_flight += 1
        slot = _Slot(self, self._usage.reserve(ask))
        try:
            outgoing = ModelRequest(checked.model, checked.body, headers)
            return await self._forward(outgoing, slot, ask)
        except BaseException:
            slot.settle(None)
            raise

    async def _forward(self, request: ModelRequest, slot: _Slot, ask: CallUsage) -> Response:
        try:
            upstream = await self._provider.send(self._http, request)
        except ProviderRefusal as e:
            slot.settle(None)  # nothing was sent, so nothing was spent
            log.warning("model request refused by the %s provider: %s", self._provider.kind,
                        e.message)  # fmt: skip
            return anthropic_error(e.status, e.kind, e.message, e.retry)
        except httpx.HTTPError as e:
            slot.settle(None)  # nothing was answered, so nothing was spent
            return anthropic_error(
                502, "api_error", f"the model upstream is unreachable: {e}", True
            )

        if upstream.is_stream:
            reader = StreamUsageReader(request.model)
            return _RelayedStream(
                upstream, reader,
                lambda ended: slot.charge(stream_charge(reader, ask, upstream_ended=ended)),
            )  # fmt: skip
        try:
            data = await upstream.read()
        except BaseException:
            # The answer was under way: charge what it could have cost.
            slot.settle(ask)
            raise
        finally:
            await upstream.aclose()
        if upstream.status_code == 200:
            slot.charge(body_charge(ask, data))
        else:
            slot.settle(None)  # a refusal by the provider: nothing was generated
        return Response(data, status_code=upstream.status_code, headers=upstream.headers)
