"""The harness's small HTTP/1.1 client (corral_harness/http1.py) against a loopback server that
answers each request in one of the framings HTTP/1.1 allows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from corral_harness.http1 import Http1Client, TransportError

ANSWERS = {
    b"/length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"/chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"6;ext=1\r\nline 1\r\n7\r\n\nline 2\r\n1\r\n\n\r\n0\r\nTrailer: x\r\n\r\n"
    ),
    b"/empty": b"HTTP/1.1 204 No Content\r\n\r\n",
    b"/close": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end",
    b"/garbled": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
}


@pytest.fixture
async def server() -> AsyncIterator[tuple[Http1Client, list[bytes], list[int]]]:
    heads: list[bytes] = []
    connections: list[int] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                heads.append(head)
                length = [
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ]
                if length:
                    await reader.readexactly(length[0])
                target = head.split(b" ")[1]
                writer.write(ANSWERS[target])
                await writer.drain()
                if target in (b"/close", b"/garbled"):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    listener = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    client = Http1Client.tcp("127.0.0.1", port)
    yield client, heads, connections
    await client.aclose()
    listener.close()
    await listener.wait_closed()


async def test_every_framing_is_read_and_the_connection_reused_when_it_can_be(
    server: tuple[Http1Client, list[bytes], list[int]],
) -> None:
    client, heads, connections = server
    async with client.request("POST", "/length", b'{"a":1}', headers={"x-run": "r1"}) as r:
        assert (r.status, await r.read()) == (200, b"hello")
    assert heads[0].startswith(b"POST /length HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"x-run: r1\r\n" in heads[0] and b"Content-Length: 7\r\n" in heads[0]
    async with client.request("GET", "/chunked") as r:
        assert [line async for line in r.lines()] == [b"line 1", b"line 2"]
    async with client.request("GET", "/empty") as r:
        assert (r.status, await r.read()) == (204, b"")
    assert len(connections) == 1  # three answers on one kept-alive connection
    async with client.request("GET", "/close") as r:
        assert await r.read() == b"to the end"
    async with client.request("GET", "/length") as r:
        assert await r.read() == b"hello"
    assert len(connections) == 2  # `Connection: close` was not reused


async def test_a_broken_answer_or_a_header_with_a_line_break_is_refused(
    server: tuple[Http1Client, list[bytes], list[int]],
) -> None:
    client, _, _ = server
    with pytest.raises(TransportError, match="malformed"):
        async with client.request("GET", "/garbled") as r:
            await r.read()
    with pytest.raises(ValueError, match="line break"):
        async with client.request("GET", "/length", headers={"x-a": "1\r\nx-b: 2"}):
            pass
    unreachable = Http1Client.unix("/nonexistent/corral.sock")
    with pytest.raises(TransportError):
        async with unreachable.request("GET", "/length"):
            pass
