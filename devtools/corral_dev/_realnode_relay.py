"""`python -m corral_dev._realnode_relay`: a TCP relay from a network namespace to this host.

The local API server listens on 127.0.0.1 of this host only. The real node's components run
in the node's own network namespace, whose 127.0.0.1 is another address; this relay listens
there (its listening sockets are made inside the namespace: on 127.0.0.1 for the node's
components, on the node's address for pods, which reach it through the `kubernetes` Service)
and connects each accepted stream to the target in the namespace it was started in. It relays
bytes and nothing else.

    python -m corral_dev._realnode_relay --netns /run/netns/NAME --target 127.0.0.1:6443 \
        --listen 127.0.0.1:6443 [--listen 198.18.128.2:6443 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def listen_in(netns: str, host: str, port: int) -> socket.socket:
    """A listening socket on host:port inside the network namespace at path `netns`."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            sock.setblocking(False)
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)
    return sock


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def _serve(sock: socket.socket, target_host: str, target_port: int) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        for w in (writer, up_writer):
            w.close()

    return await asyncio.start_server(handle, sock=sock)


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _main(netns: str, target: tuple[str, int], listen: list[tuple[str, int]]) -> None:
    socks = [listen_in(netns, host, port) for host, port in listen]
    servers = [await _serve(s, *target) for s in socks]
    print(f"relaying {listen} in {netns} to {target}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corral_dev._realnode_relay")
    parser.add_argument("--netns", required=True, help="path of the network namespace")
    parser.add_argument("--target", required=True, type=_addr, help="HOST:PORT here")
    parser.add_argument(
        "--listen",
        required=True,
        type=_addr,
        action="append",
        help="HOST:PORT in the namespace (repeatable)",
    )
    args = parser.parse_args(argv)
    asyncio.run(_main(args.netns, args.target, args.listen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
