"""The lean engine adapter: the Messages API over httpx with the project's own stream reader
(`corral_common.sse`, the parser the custodian counts usage with).

The default engine (`choice.py`). It exists for the cold start: the official SDK's import was
most of the path from a pod's start to its first model request (the figures: ADR 0014,
docs/performance.md "First model request"); httpx is already loaded by the harness. It speaks
exactly what the harness uses of the API: one streaming `POST /v1/messages` per generation,
`x-api-key` (the pod-local credential; the custodian swaps in the real key) and
`anthropic-version`. The tool loop and the retry, silence and cap rules are the shared loop's
(`_loop.py`); the SDK adapter (`anthropic_engine.py`) is the reference it is tested against.

Errors as the SDK adapter names them: an HTTP error answers with the body's `error.type`
(else `model_error`), retried on 408/409/429/5xx unless `x-should-retry` says otherwise; an
`error` event inside the stream likewise; a broken connection is `connection_error` (retried);
a stream without `message_stop` is `stream_truncated` (retried); an event that is not JSON is
kept as data, and fails the stream as `model_error` only if no `error` event follows it; every
retry only while nothing has been forwarded, after the server's `retry-after` when it says one.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from corral_common.sse import EventStreamParser, EventTooLarge

from ..http1 import Http1Client, TransportError
from ._accumulate import MessageBuilder
from ._loop import (
    EngineSettings,
    StreamFailure,
    StreamingEngine,
    check_finished,
    retry_after,
    retryable_status,
    stream_clock,
)

DEFAULT_BASE_URL = "https://api.anthropic.com"
# The API version the reference adapter's SDK (anthropic 2.14) sends; the conformance test
# `test_the_run_id_and_api_version_go_with_every_model_request` keeps the two the same.
API_VERSION = "2026-10-21"

# One client (one connection pool) per event loop and endpoint, reused across submissions.
_clients: dict[tuple[int, str | None, str], httpx.AsyncClient] = {}


def _client(settings: EngineSettings) -> httpx.AsyncClient:
    key = (id(asyncio.get_running_loop()), settings.base_url, settings.api_key)
    client = _clients.get(key)
    if client is None:
        client = httpx.AsyncClient(
            base_url=(settings.base_url or DEFAULT_BASE_URL).rstrip("/"),
            headers={
                "x-api-key": settings.api_key,
                "anthropic-version": API_VERSION,
                "content-type": "application/json",
                "accept": "text/event-stream",
                "user-agent": "corral-harness-lean-engine",
            },
            timeout=settings.stream_cap_seconds,
        )
        _clients[key] = client
    return client


# The custodian in the pod is a plain-HTTP endpoint: there the small client (`http1`) carries
# the request, and httpx only where it may meet TLS, a proxy or credentials in the URL.
_direct: dict[tuple[int, str], tuple[weakref.ref[asyncio.AbstractEventLoop], Http1Client, str]] = {}


def _direct_client(settings: EngineSettings) -> tuple[Http1Client, str] | None:
    """The small client and the path prefix for a plain-HTTP endpoint no proxy stands before."""
    base = (settings.base_url or DEFAULT_BASE_URL).rstrip("/")
    loop = asyncio.get_running_loop()
    key = (id(loop), base)
    found = _direct.get(key)
    if found is not None and found[0]() is loop:  # not a closed loop's that had the same id
        return found[1], found[2]
    url = urllib.parse.urlsplit(base)
    if url.scheme != "http" or not url.hostname or url.username or url.query or url.fragment:
        return None
    proxies = urllib.request.getproxies()  # what httpx would read from the environment
    if ("http" in proxies or "all" in proxies) and not urllib.request.proxy_bypass(url.hostname):
        return None
    client = Http1Client.tcp(url.hostname, url.port or 80)
    _direct[key] = (weakref.ref(loop), client, url.path)
    return client, url.path


# The parts of a request that come back unchanged call after call (the system prompt with every
# AGENTS.md of the tree, the tool list), as last encoded: equal values reuse their JSON.
_REUSED_PARTS = ("system", "tools")
_encoded_parts: dict[str, tuple[Any, str]] = {}


def encode_request(params: dict[str, Any]) -> bytes:
    """`json.dumps(params)`, byte for byte, without encoding the system prompt and the tools
    again when they are the ones of the last request."""
    fields: list[str] = []
    for key, value in params.items():
        if key in _REUSED_PARTS:
            last = _encoded_parts.get(key)
            if last is not None and (last[0] is value or last[0] == value):
                encoded = last[1]
            else:
                encoded = json.dumps(value)
                _encoded_parts[key] = (value, encoded)
        else:
            encoded = json.dumps(value)
        fields.append(f"{json.dumps(key)}: {encoded}")
    return ("{" + ", ".join(fields) + "}").encode()


class LeanEngine(StreamingEngine):
    """Runs one submission's tool loop against the Messages API over plain httpx, or over the
    small client (`http1`) where the endpoint is plain HTTP with no proxy before it."""

    direct = True  # False: always httpx (the conformance suite runs both ways)

    @classmethod
    def prepare(cls, settings: EngineSettings) -> None:
        _client(settings)  # its TLS context is a cost of its own (docs/performance.md)
        _direct_client(settings)

    async def _stream_once(self, params: dict[str, Any], builder: MessageBuilder) -> None:
        body = encode_request(params)
        direct = _direct_client(self.settings) if self.direct else None
        if direct is not None:
            await self._stream_direct(direct, body, builder)
            return
        client = _client(self.settings)
        try:
            async with (
                stream_clock(self.settings) as tick,
                client.stream(
                    "POST", "/v1/messages", content=body, headers=self.headers
                ) as response,
            ):
                if response.status_code != 200:
                    raise _status_failure(
                        response.status_code, response.headers, await response.aread()
                    )
                await _read_stream(response.aiter_bytes(), response.headers, tick, builder)
        except httpx.TransportError as exc:
            raise StreamFailure(
                "connection_error", f"model connection failed: {exc!r}", retryable=True
            ) from None
        check_finished(builder)

    async def _stream_direct(
        self, direct: tuple[Http1Client, str], body: bytes, builder: MessageBuilder
    ) -> None:
        client, prefix = direct
        headers = {**_HEADERS, "x-api-key": self.settings.api_key, **self.headers}
        try:
            async with (
                stream_clock(self.settings) as tick,
                client.request("POST", f"{prefix}/v1/messages", body, headers=headers) as response,
            ):
                if response.status != 200:
                    raise _status_failure(response.status, response.headers, await response.read())
                # As it arrives, not by lines: a stream whose lines end with a lone CR has no
                # LF to split at, and a reader by lines would see nothing of it until its end.
                await _read_stream(response.chunks(), response.headers, tick, builder)
        except TransportError as exc:
            raise StreamFailure(
                "connection_error", f"model connection failed: {exc}", retryable=True
            ) from None
        check_finished(builder)


_HEADERS = {
    "anthropic-version": API_VERSION,
    "content-type": "application/json",
    "accept": "text/event-stream",
    "user-agent": "corral-harness-lean-engine",
}


async def _read_stream(
    pieces: AsyncIterator[bytes],
    headers: Mapping[str, str],
    tick: Any,
    builder: MessageBuilder,
    *,
    split_at_lf: bool = False,
) -> None:
    """Feed a 200 stream's events to the builder. `pieces` are the body's bytes in any
    chunking (both transports hand them over as they arrive), or, `split_at_lf`, its lines as
    a transport that splits at LF hands them over (the LF dropped); the parser finds every
    other line end (CR, CRLF) itself."""
    parser = EventStreamParser()
    feed = parser.feed_line if split_at_lf else parser.feed
    try:
        async for piece in pieces:
            for sse in feed(piece):
                if sse.event == "message" or sse.event == "ping" or not sse.data:
                    continue  # the SDK skips these too: a ping does not end a silence
                tick()
                if sse.event == "error":
                    raise _status_failure(200, headers, sse.data.encode())
                try:
                    event = json.loads(sse.data)
                except ValueError:
                    event = None
                if isinstance(event, dict):
                    builder.on_event(event)
                else:
                    builder.on_undecodable(sse.data)  # `check_finished` fails the stream
    except EventTooLarge as exc:
        raise StreamFailure("model_error", f"the model stream: {exc}", retryable=True) from None
    # An event cut off before its blank line is dropped: the stream then lacks message_stop.
    parser.close()


def _status_failure(status: int, headers: Mapping[str, str], raw: bytes) -> StreamFailure:
    """A refusal (HTTP status) or an `error` event (inside a 200 stream), as the SDK names it."""
    kind, message = "model_error", f"Error code: {status} - {raw.decode(errors='replace')}"
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        if isinstance(err.get("type"), str):
            kind = err["type"]
        if isinstance(err.get("message"), str):
            message = err["message"]
    return StreamFailure(
        kind,
        f"model error {status}: {message}",
        retryable=retryable_status(status, headers.get("x-should-retry"), kind),
        retry_after=retry_after(headers) if status != 200 else None,
    )
