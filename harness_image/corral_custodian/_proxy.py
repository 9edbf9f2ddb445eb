"""The model proxy: the harness's ANTHROPIC_BASE_URL points here, and only here is the key.

Each request is checked before anything goes upstream: its size, the model (the Agent's or the
Session's override only), max_tokens (clamped), the number of requests in flight, and the
budget, against which the request's worst case (its input estimate and all of its max_tokens,
at catalog prices) is reserved. The request then goes to the upstream Messages API with the
custodian's key in place of whatever the caller sent; a streamed answer passes through chunk by
chunk as it arrives. When the answer ends, however it ends (completed, upstream error, the
caller gone, the custodian stopping), the reservation is settled to the usage the answer
reported. Refusals are Anthropic-style error bodies; `x-should-retry` says whether the SDK may
try again (a full concurrency slot: yes; a budget, model or size refusal: no).
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
    StreamUsageReader,
    held_by,
    reservation_for,
    reservation_refusal,
    usage_of_body,
)
from .model_rules import ModelRefusal, check_request
from .settings import CustodianSettings

log = logging.getLogger("corral_custodian.proxy")

# Never forwarded upstream: the caller's credentials, betas (they widen what a request may
# make the provider do beyond what is checked here), hop-by-hop and recomputed headers.
_DROP_REQUEST = {
    "x-api-key", "authorization", "cookie", "host", "content-length", "connection",
    "transfer-encoding", "accept-encoding", "proxy-authorization", "keep-alive",
    "anthropic-beta",
}  # fmt: skip
_KEEP_RESPONSE = {"content-type", "request-id", "retry-after", "x-should-retry"}


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


class _RelayedStream(StreamingResponse):
    """Pass an upstream SSE stream through, and settle when it ends however it ends.

    Starlette's StreamingResponse leaves the body iterator unfinished when the client goes,
    so the settlement would wait for garbage collection; this one watches for the disconnect
    itself and settles in `finally`.
    """

    def __init__(
        self,
        upstream: httpx.Response,
        headers: dict[str, str],
        reader: StreamUsageReader,
        on_end: Callable[[], None],
    ) -> None:
        super().__init__(
            _never(), status_code=upstream.status_code, headers=headers,
            media_type="text/event-stream",
        )  # fmt: skip
        self._upstream = upstream
        self._reader = reader
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(self._watch(receive))
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            pump.cancel()
            watch.cancel()
            self._reader.close()
            self._on_end()  # synchronous: it happens even if this task is being cancelled
            await asyncio.gather(pump, watch, return_exceptions=True)
            await self._upstream.aclose()

    async def _pump(self, send: Send) -> None:
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code,
                 "headers": self.raw_headers}
            )  # fmt: skip
            try:
                async for chunk in self._upstream.aiter_raw():
                    self._reader.feed(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.HTTPError as e:
                event = {"type": "error", "error": {"type": "api_error",
                         "message": f"the model upstream broke off the stream: {e}"}}  # fmt: skip
                payload = f"event: error\ndata: {json.dumps(event)}\n\n".encode()
                await send({"type": "http.response.body", "body": payload, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            return  # the client is gone

    @staticmethod
    async def _watch(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass


async def _never() -> Any:
    return
    yield  # an empty async generator: _RelayedStream sends its own body


class ModelProxy:
    def __init__(self, settings: CustodianSettings, live: LiveState, usage: UsageStore) -> None:
        self._settings = settings
        self._upstream = settings.upstream_url
        self._key = settings.model_key
        self._live = live
        self._usage = usage
        self._in_flight = 0
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0))

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def aclose(self) -> None:
        await self._http.aclose()

    async def messages(self, request: Request) -> Response:
        limit = self._settings.max_body_bytes
        try:
            raw = await read_capped(request, limit)
        except BodyTooLarge:
            return anthropic_error(
                413, "request_too_large", f"the request body is larger than {limit} bytes"
            )
        try:
            body: Any = json.loads(raw)
        except ValueError:
            return anthropic_error(400, "invalid_request_error", "the body is not JSON")
        if not isinstance(body, dict):
            return anthropic_error(400, "invalid_request_error", "the body must be an object")
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
            log.warning("model request refused: %s", checked.message)
            return anthropic_error(checked.status, checked.kind, checked.message)
        if checked.changed:
            raw = json.dumps(checked.body).encode()

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
            return await self._forward(request, raw, checked.model, slot, ask)
        except BaseException:
            slot.settle(None)
            raise

    async def _forward(
        self, request: Request, raw: bytes, model: str, slot: _Slot, ask: CallUsage
    ) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        # Identity, so the bytes passed through are the bytes the usage reader can parse.
        headers["accept-encoding"] = "identity"
        headers["content-type"] = "application/json"
        if self._key:
            headers["x-api-key"] = self._key
        url = self._upstream + "/v1/messages"
        try:
            upstream = await self._http.send(
                self._http.build_request("POST", url, content=raw, headers=headers), stream=True
            )
        except httpx.HTTPError as e:
            slot.settle(None)  # nothing was answered, so nothing was spent
            return anthropic_error(
                502, "api_error", f"the model upstream is unreachable: {e}", True
            )

        out_headers = {k: v for k, v in upstream.headers.items() if k.lower() in _KEEP_RESPONSE}
        content_type = upstream.headers.get("content-type", "")
        if upstream.status_code == 200 and content_type.startswith("text/event-stream"):
            reader = StreamUsageReader(model)
            return _RelayedStream(
                upstream, out_headers, reader, lambda: slot.settle(reader.settled())
            )
        try:
            data = await upstream.aread()
        except BaseException:
            # The answer was under way: charge what it could have cost.
            slot.settle(ask)
            raise
        finally:
            await upstream.aclose()
        call: CallUsage | None = None
        if upstream.status_code == 200:
            try:
                call = usage_of_body(model, json.loads(data))
            except ValueError:
                call = ask  # an answer we cannot read still cost something
        slot.settle(call)
        return Response(data, status_code=upstream.status_code, headers=out_headers)
