"""The engine adapter on the official `anthropic` SDK (AsyncAnthropic, streaming): the reference.

This is the only module that imports the SDK. Its import is slow (ADR 0014), so it is chosen only
with CORRAL_ENGINE=sdk (`choice.py`), and then loaded in a thread after the server listens. The
tool loop and the retry, silence and cap rules are the shared loop's (`_loop.py`); this module
adds the transport. The SDK's own retries are off so that the loop's rule is the only one.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anthropic
import httpx2  # the SDK's own HTTP client (a fork of httpx it depends on)
from anthropic.types import RawMessageStreamEvent

from ._accumulate import MessageBuilder
from ._loop import INTERRUPTED, EngineSettings, StreamFailure, StreamingEngine, retryable_status
from ._loop import stream_clock as _stream_clock

__all__ = ["INTERRUPTED", "AnthropicEngine", "EngineSettings"]

# The stream's event union; a typing special form, so mypy sees it as Any.
_EVENT: Any = RawMessageStreamEvent

# One client (one connection pool) per event loop and endpoint, reused across submissions.
_clients: dict[tuple[int, str | None, str], anthropic.AsyncAnthropic] = {}


def _client(settings: EngineSettings) -> anthropic.AsyncAnthropic:
    key = (id(asyncio.get_running_loop()), settings.base_url, settings.api_key)
    client = _clients.get(key)
    if client is None:
        client = anthropic.AsyncAnthropic(
            api_key=settings.api_key,
            base_url=settings.base_url,
            max_retries=0,
            timeout=settings.stream_cap_seconds,
        )
        _clients[key] = client
    return client


class AnthropicEngine(StreamingEngine):
    """Runs one submission's tool loop against the Messages API through the SDK."""

    async def _stream_once(self, params: dict[str, Any], builder: MessageBuilder) -> None:
        client = _client(self.settings)
        try:
            async with _stream_clock(self.settings) as tick:
                # `post` is the SDK's own request path for /v1/messages; `messages.create` would
                # first re-walk every message of the transcript through its type transform on
                # every request, a cost that grows with the turn.
                stream = await client.post(
                    "/v1/messages",
                    body=params,
                    cast_to=_EVENT,
                    stream=True,
                    stream_cls=anthropic.AsyncStream[_EVENT],
                    options={"headers": self.headers},
                )
                try:
                    async for event in stream:
                        tick()
                        builder.on_event(event)
                finally:
                    with contextlib.suppress(Exception):
                        await stream.close()
        except anthropic.APIStatusError as exc:
            status = exc.status_code
            raise StreamFailure(
                _error_type(exc),
                f"model error {status}: {_error_message(exc)}",
                retryable=retryable_status(status, exc.response.headers.get("x-should-retry")),
            ) from None
        except (anthropic.APIConnectionError, httpx2.TransportError) as exc:
            # The SDK wraps a failure to connect; a connection broken mid-stream comes through
            # as its HTTP client's own error.
            raise StreamFailure(
                "connection_error", f"model connection failed: {exc!r}", retryable=True
            ) from None
        if not builder.finished:
            raise StreamFailure(
                "stream_truncated", "the model stream ended before message_stop", retryable=True
            )


def _error_type(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("type"), str):
            return str(err["type"])
    return "model_error"


def _error_message(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
    return str(exc)
