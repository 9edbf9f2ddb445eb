"""A small HTTP/1.1 client on asyncio streams, for the two requests of every step.

Each step of a turn makes one model request (to the custodian, plain HTTP in the pod) and one
exec request (to the tools container's Unix socket). A general client (httpx with httpcore, h11
and anyio under it) spent more of the harness's CPU on each of them than the exec service takes
to run `echo` (the figures: docs/performance.md, "Steps on a real repository"; ADR 0087). Both
peers speak a small part of HTTP/1.1, so this client speaks exactly that: keep-alive
connections reused one request at a time, the request's head and body in one write, a response
with Content-Length, chunked transfer coding, or read to the end of the connection. No TLS,
proxies, redirects, cookies or compression: a caller that may meet those (an https model
endpoint, a proxy in the environment) uses httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

HEAD_LIMIT = 64 * 1024  # the status line and headers, as the service sends them: a few lines
MAX_IDLE = 4  # kept-alive connections; more are only open while requests run at once


class TransportError(Exception):
    """The peer could not be reached, or broke off or garbled an answer."""


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def usable(self) -> bool:
        # A connection the service closed while it sat idle has seen its end already.
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class Response:
    """One answer: its status, then its body in full (`read`), line by line (`lines`), or as
    it arrives (`chunks`)."""

    def __init__(
        self, client: Http1Client, conn: _Connection, status: int, headers: dict[str, str]
    ):
        self.status = status
        self.headers = headers  # names in lower case
        self._client = client
        self._conn: _Connection | None = conn
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        if status in (204, 304) or 100 <= status < 200:
            self._chunked, length = False, "0"  # no body, whatever the headers say
        self._left = int(length) if length is not None and not self._chunked else None
        self._reusable = headers.get("connection", "").lower() != "close" and (
            self._chunked or self._left is not None
        )

    async def _pieces(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._raw_pieces():
                yield piece
        except BaseException as exc:
            self.close()
            if (error := _transport_error(exc)) is exc:
                raise
            raise error from exc

    async def _raw_pieces(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        reader = conn.reader
        if self._chunked:
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":
                        pass  # trailers: none are sent, none are needed
                    return
                piece = await reader.readexactly(size)
                if await reader.readexactly(2) != b"\r\n":
                    raise ValueError("a chunk does not end with CRLF")
                yield piece
        elif self._left is not None:
            if self._left:
                yield await reader.readexactly(self._left)
        else:
            while piece := await reader.read(65536):
                yield piece

    async def read(self) -> bytes:
        parts = [piece async for piece in self._pieces()]
        self._finish()
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive, in whatever pieces they come."""
        async for piece in self._pieces():
            yield piece
        self._finish()

    async def lines(self) -> AsyncIterator[bytes]:
        """The body's lines without their newlines; a last line without one is yielded too."""
        pending = b""
        async for piece in self._pieces():
            pending += piece
            *whole, pending = pending.split(b"\n")
            for line in whole:
                yield line
        if pending:
            yield pending
        self._finish()

    def _finish(self) -> None:
        """The body was read to its end: the connection can carry the next request."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._client._release(conn, reusable=self._reusable)

    def close(self) -> None:
        """Give the connection up unread (an error, a cancelled command): it is closed, which
        tells the service to stop the command still running."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


Connector = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class Http1Client:
    """Requests to one peer; `unix(path)` or `tcp(host, port)` make one."""

    def __init__(self, connect: Connector, host: str) -> None:
        self._connect = connect
        self.host = host  # the Host header
        self._idle: list[_Connection] = []

    @classmethod
    def unix(cls, path: str, host: str = "localhost") -> Http1Client:
        async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            return await asyncio.open_unix_connection(path, limit=HEAD_LIMIT)

        return cls(connect, host)

    @classmethod
    def tcp(cls, host: str, port: int) -> Http1Client:
        async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            return await asyncio.open_connection(host, port, limit=HEAD_LIMIT)

        return cls(connect, f"[{host}]:{port}" if ":" in host else f"{host}:{port}")

    async def _connection(self, connect_timeout: float) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn
            conn.close()
        async with asyncio.timeout(connect_timeout):
            reader, writer = await self._connect()
        return _Connection(reader, writer)

    def _release(self, conn: _Connection, *, reusable: bool) -> None:
        if reusable and conn.usable() and len(self._idle) < MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.close()

    @contextlib.asynccontextmanager
    async def request(
        self,
        method: str,
        target: str,
        body: bytes | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = 5.0,
    ) -> AsyncIterator[Response]:
        """Send one request (the body's type is the caller's header); the response's body must
        be read inside the block, or the connection is closed when it is left."""
        head = f"{method} {target} HTTP/1.1\r\nHost: {self.host}\r\n"
        for name, value in (headers or {}).items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r} holds a line break")
            head += f"{name}: {value}\r\n"
        if body is not None:
            head += f"Content-Length: {len(body)}\r\n"
        data = (head + "\r\n").encode("ascii") + (body or b"")
        conn: _Connection | None = None
        try:
            conn = await self._connection(connect_timeout)
            conn.writer.write(data)  # head and body in one write: one wake-up for the service
            await conn.writer.drain()
            status, headers = await _read_head(conn.reader)
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if (error := _transport_error(exc)) is exc:
                raise
            raise error from exc
        response = Response(self, conn, status, headers)
        try:
            yield response
        finally:
            response.close()  # a no-op once the body was read to its end

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _transport_error(exc: BaseException) -> BaseException:
    """What an I/O failure is for the caller: an TransportError; anything else (a
    cancellation above all) stays what it is."""
    if isinstance(exc, TimeoutError):
        return TransportError("the peer did not answer in time")
    if isinstance(
        exc, OSError | EOFError | asyncio.IncompleteReadError | asyncio.LimitOverrunError
    ):
        return TransportError(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    if isinstance(exc, ValueError):
        return TransportError(f"the peer sent a malformed answer: {exc}")
    return exc


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers
