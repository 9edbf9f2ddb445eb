"""The model proxy's relay of an upstream answer, against a stand-in upstream: a stream that
breaks off mid-line reaches the lean engine's reader as the custodian's `api_error`, and a
refusal's retry headers pass through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import pytest

from corral_api.providers import implicit_provider
from corral_custodian._proxy import ModelProxy, _RelayedStream, _Slot
from corral_custodian.budget import CallUsage, StreamUsageReader
from corral_custodian.providers import ModelRequest, UpstreamAnswer
from corral_custodian.providers._messages import MessagesProvider
from corral_harness.engine._accumulate import MessageBuilder
from corral_harness.engine._loop import StreamFailure
from corral_harness.engine.lean_engine import _read_stream

pytestmark = pytest.mark.timeout(30)


class _BrokenUpstream(UpstreamAnswer):
    """An upstream stream that sends part of a line and then fails as a dropped connection."""

    status_code = 200

    def __init__(self, sent: bytes) -> None:
        self.sent = sent
        self.headers = {"content-type": "text/event-stream"}

    @property
    def is_stream(self) -> bool:
        return True

    async def stream(self) -> AsyncIterator[bytes]:
        yield self.sent
        raise httpx.ReadError("connection reset by peer")

    async def read(self) -> bytes:
        raise AssertionError("a stream is never read whole")

    async def aclose(self) -> None:
        return None


async def _relayed(sent: bytes) -> bytes:
    body: list[bytes] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body":
            body.append(message["body"])

    async def receive() -> MutableMapping[str, Any]:
        await asyncio.Event().wait()  # the caller stays: only the upstream ends the answer
        return {"type": "http.disconnect"}

    relay = _RelayedStream(
        _BrokenUpstream(sent),
        StreamUsageReader("claude-haiku-4-5"),
        lambda ended: None,
    )
    await relay({"type": "http"}, receive, send)
    return b"".join(body)


@pytest.mark.parametrize(
    "sent",
    [
        b'event: message_start\ndata: {"type": "message_start", "message": {"usage": {"input_to',
        b'event: message_start\ndata: {"type": "message_start", "message": {}}\n\nevent: ping',
        b'event: message_start\ndata: {"type": "message_start", "message": {}}\n\n',
    ],
    ids=["mid-line", "mid-event", "boundary"],
)
async def test_a_stream_broken_anywhere_reaches_the_harness_as_an_api_error(sent: bytes) -> None:
    relayed = await _relayed(sent)
    assert relayed.startswith(sent)  # what had come passes unchanged

    async def pieces() -> AsyncIterator[bytes]:
        yield relayed

    with pytest.raises(StreamFailure) as failed:
        await _read_stream(pieces(), {}, lambda: None, MessageBuilder())
    assert failed.value.kind == "api_error"
    assert "broke off" in failed.value.message


class _Usage:
    def settle(self, ticket: int, actual: CallUsage | None) -> None:
        return None


async def test_a_refusals_retry_headers_pass_through() -> None:
    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            429,
            json={"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}},
            headers={"retry-after": "2", "retry-after-ms": "1500", "x-other": "kept out"},
        )

    proxy = object.__new__(ModelProxy)
    proxy._http = httpx.AsyncClient(transport=httpx.MockTransport(upstream))
    proxy._provider = MessagesProvider(implicit_provider("http://upstream"), None)
    proxy._in_flight = 1
    proxy._usage = _Usage()  # type: ignore[assignment]
    request = ModelRequest("m", {"model": "m"}, {})
    try:
        answer = await proxy._forward(request, _Slot(proxy, 0), CallUsage())
    finally:
        await proxy._http.aclose()
    assert answer.status_code == 429
    assert answer.headers["retry-after"] == "2"
    assert answer.headers["retry-after-ms"] == "1500"
    assert "x-other" not in answer.headers
