"""A stand-in harness whose answers never end (a raw asyncio HTTP/1.1 server on loopback,
named as such): what a compromised harness does to a reader that trusts it.

Every request is answered with `status` and a JSON body that opens like the wire's
(`{"events":[...`) and then streams events without end, chunked, or under a declared
`Content-Length` far beyond anything sent. The server counts the body bytes it handed to the
socket and notes when the reader closed the connection. Its send buffer is kept small, so what
it counts is close to what the reader took in (plus the reader's own socket buffer).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import dataclass, field

EVENT = b'{"offset":0,"type":"tool_output","submissionId":"s1","text":"' + b"x" * 4000 + b'"},'
PIECE = EVENT * 16  # 64 KiB a write


@dataclass
class EndlessHarness:
    status: int = 200
    declared_length: int | None = None  # None: chunked
    extra_headers: tuple[tuple[str, str], ...] = ()
    requests: list[str] = field(default_factory=list)
    sent: int = 0  # body bytes handed to the socket, all connections together
    closed: threading.Event = field(default_factory=threading.Event)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.Server | None = None
    url: str = ""

    def start(self) -> str:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop

            async def serve() -> None:
                self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
                port = self._server.sockets[0].getsockname()[1]
                self.url = f"http://127.0.0.1:{port}"
                ready.set()

            loop.run_until_complete(serve())
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="endless-harness", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the endless stand-in did not start")
        return self.url

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            loop.stop()

        asyncio.run_coroutine_threadsafe(shut(), loop)
        if self._thread is not None:
            self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)
        writer.transport.set_write_buffer_limits(high=64 * 1024)
        chunked = self.declared_length is None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.requests.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
            lines = [f"HTTP/1.1 {self.status} Stand-in", "Content-Type: application/json"]
            if chunked:
                lines.append("Transfer-Encoding: chunked")
            else:
                lines.append(f"Content-Length: {self.declared_length}")
            lines += [f"{name}: {value}" for name, value in self.extra_headers]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            body = b'{"events":[' + PIECE
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(body), body) if chunked else body)
                self.sent += len(body)
                await writer.drain()
                body = PIECE
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass  # the reader closed the connection: what it was meant to do
        finally:
            self.closed.set()
            writer.close()
