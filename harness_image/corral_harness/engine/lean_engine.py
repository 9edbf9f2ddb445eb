"""The lean engine adapter: the Messages API over httpx with the project's own stream reader.

The default engine (`choice.py`). It exists for the cold start: the official SDK's import
costs seconds (its `types` package alone over a second on 2 cores), and it stood between a
pod's start and its first model request; httpx is already loaded by the harness. It speaks
exactly what the harness uses of the API: one streaming `POST /v1/messages` per generation,
`x-api-key` (the pod-local credential; the custodian swaps in the real key) and
`anthropic-version`. The tool loop and the retry, silence and cap rules are the shared loop's
(`_loop.py`); the SDK adapter (`anthropic_engine.py`) is the reference it is tested against.

Errors as the SDK adapter names them: an HTTP error answers with the body's `error.type`
(else `model_error`), retried on 408/409/429/5xx unless `x-should-retry` says otherwise; an
`error` event inside the stream likewise; a broken connection is `connection_error` (retried);
a stream without `message_stop` is `stream_truncated` (retried); every retry only while nothing
has been forwarded.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from ._accumulate import MessageBuilder
from ._loop import EngineSettings, StreamFailure, StreamingEngine, retryable_status, stream_clock
from ._sse import read_events

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


class LeanEngine(StreamingEngine):
    """Runs one submission's tool loop against the Messages API over plain httpx."""

    @classmethod
    def prepare(cls, settings: EngineSettings) -> None:
        _client(settings)  # its TLS context alone is tens of milliseconds

    async def _stream_once(self, params: dict[str, Any], builder: MessageBuilder) -> None:
        client = _client(self.settings)
        body = json.dumps(params).encode()
        try:
            async with (
                stream_clock(self.settings) as tick,
                client.stream(
                    "POST", "/v1/messages", content=body, headers=self.headers
                ) as response,
            ):
                if response.status_code != 200:
                    raise _status_failure(response, await response.aread())
                async for sse in read_events(response.aiter_lines()):
                    if sse.event is None or sse.event == "ping" or not sse.data:
                        continue  # the SDK skips these too: a ping does not end a silence
                    tick()
                    if sse.event == "error":
                        raise _status_failure(response, sse.data.encode())
                    builder.on_event(json.loads(sse.data))
        except httpx.TransportError as exc:
            raise StreamFailure(
                "connection_error", f"model connection failed: {exc!r}", retryable=True
            ) from None
        except json.JSONDecodeError as exc:
            raise StreamFailure(
                "model_error",
                f"the model stream sent an event that is not JSON: {exc}",
                retryable=True,
            ) from None
        if not builder.finished:
            raise StreamFailure(
                "stream_truncated", "the model stream ended before message_stop", retryable=True
            )


def _status_failure(response: httpx.Response, raw: bytes) -> StreamFailure:
    """A refusal (HTTP status) or an `error` event (inside a 200 stream), as the SDK names it."""
    status = response.status_code
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
        retryable=retryable_status(status, response.headers.get("x-should-retry")),
    )
