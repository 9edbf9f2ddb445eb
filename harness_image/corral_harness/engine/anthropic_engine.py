"""The engine adapter on the official `anthropic` SDK (AsyncAnthropic, streaming): the reference.

This is the only module that imports the SDK. Its import is slow (ADR 0014), so it is chosen only
with CORRAL_ENGINE=sdk (`choice.py`), and then loaded in a thread after the server listens. The
tool loop and the retry, silence and cap rules are the shared loop's (`_loop.py`); this module
adds the transport. The SDK's own retries are off so that the loop's rule is the only one.

The SDK sends the request and types each event; the stream's bytes are cut into events by the
project's own parser (`corral_common.sse`), the one the lean adapter and the custodian read the
same bytes with. The SDK's cutter held back an event whose blank line followed a line end of
another kind (LF, then a lone CR) until more bytes came, and read nothing of a stream opening
with a byte order mark; with one parser, every adapter sees the same events as they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import anthropic
import httpx2  # the SDK's own HTTP client (a fork of httpx it depends on)
from anthropic.types import RawMessageStreamEvent

from corral_common.sse import Event, EventStreamParser

from ._accumulate import MessageBuilder
from ._loop import (
    INTERRUPTED,
    EngineSettings,
    StreamFailure,
    StreamingEngine,
    check_finished,
    retry_after,
    retryable_status,
)
from ._loop import stream_clock as _stream_clock

__all__ = ["INTERRUPTED", "AnthropicEngine", "EngineSettings"]

# The stream's event union; a typing special form, so mypy sees it as Any.
_EVENT: Any = RawMessageStreamEvent

_T = TypeVar("_T")


class _Undecodable:
    """An event whose data is not JSON, handed to the builder as data."""

    def __init__(self, data: str) -> None:
        self.data = data


async def _events(chunks: AsyncIterator[bytes]) -> AsyncIterator[Event]:
    """The body's events as each one's blank line arrives; an event cut off before it is
    dropped (the stream then lacks message_stop). A line or event past the parser's cap
    raises `EventTooLarge`, a ValueError: a model error, as in the lean adapter."""
    parser = EventStreamParser()
    async for chunk in chunks:
        for sse in parser.feed(chunk):
            yield sse
    parser.close()


class _TolerantStream(anthropic.AsyncStream[_T]):
    """The SDK's stream, except that its events are cut by the shared parser (`_events`), and
    an event that is not JSON (a line cut by a dropped connection) comes out as `_Undecodable`
    instead of raising: an `error` event after it still names the failure, as in the lean
    adapter. The error raised for an `error` event and the typing of every other event are
    the SDK's; events with no name ("message") and pings are skipped, as the SDK does."""

    async def __stream__(self) -> AsyncIterator[_T]:
        response = self.response
        try:
            async for sse in _events(response.aiter_bytes()):
                if sse.event in ("message", "ping"):
                    continue
                if sse.event == "error":
                    try:
                        body: Any = json.loads(sse.data)
                        message = f"{body}"
                    except ValueError:
                        body = message = sse.data
                    raise self._client._make_status_error(message, body=body, response=response)
                if not sse.data:
                    continue
                try:
                    data = json.loads(sse.data)
                except ValueError:
                    data = None
                if not isinstance(data, dict):
                    yield _Undecodable(sse.data)  # type: ignore[misc]
                    continue
                yield self._client._process_response_data(
                    data=data, cast_to=self._cast_to, response=response
                )
        finally:
            await response.aclose()


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
                    stream_cls=_TolerantStream[_EVENT],
                    options={"headers": self.headers},
                )
                try:
                    async for event in stream:
                        tick()
                        if isinstance(event, _Undecodable):
                            builder.on_undecodable(event.data)  # `check_finished` fails it
                        else:
                            builder.on_event(event)
                finally:
                    with contextlib.suppress(Exception):
                        await stream.close()
        except anthropic.APIStatusError as exc:
            status, headers, kind = exc.status_code, exc.response.headers, _error_type(exc)
            raise StreamFailure(
                kind,
                f"model error {status}: {_error_message(exc)}",
                retryable=retryable_status(status, headers.get("x-should-retry"), kind),
                retry_after=retry_after(headers) if status != 200 else None,
            ) from None
        except (anthropic.APIConnectionError, httpx2.TransportError) as exc:
            # The SDK wraps a failure to connect; a connection broken mid-stream comes through
            # as its HTTP client's own error.
            raise StreamFailure(
                "connection_error", f"model connection failed: {exc!r}", retryable=True
            ) from None
        except ValueError as exc:  # anything else the SDK could not decode: data, not a crash
            raise StreamFailure(
                "model_error", f"the model stream could not be decoded: {exc}", retryable=True
            ) from None
        check_finished(builder)


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
