"""`corral-proxy-tunnel HOST PORT`: a TCP stream to HOST:PORT through the egress gateway's
CONNECT, on stdin and stdout, for clients that speak no HTTP proxy themselves: git's
`GIT_PROXY_COMMAND` for git:// remotes, ssh's `ProxyCommand` (docs/egress.md).

The gateway and the credential come from HTTPS_PROXY (or https_proxy), as the process's HTTP
clients read them: the custodian's URL carries its proxy credential, the tools' none. A refusal
prints the gateway's reason and exits 1; no proxy set exits 2.
"""

from __future__ import annotations

import base64
import os
import select
import socket
import sys
from collections.abc import Mapping, Sequence
from urllib.parse import unquote, urlsplit

_CHUNK = 64 * 1024


class TunnelRefused(Exception):
    """The gateway answered the CONNECT with something other than 200."""


def connect_request(host: str, port: int, proxy: str) -> bytes:
    """The CONNECT request for HOST:PORT, with the proxy URL's credential when it has one."""
    parts = urlsplit(proxy)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if parts.password is not None:
        pair = f"{unquote(parts.username or '')}:{unquote(parts.password)}"
        lines.append(f"Proxy-Authorization: Basic {base64.b64encode(pair.encode()).decode()}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def open_tunnel(host: str, port: int, proxy: str, timeout: float = 10.0) -> socket.socket:
    """A socket whose bytes are HOST:PORT's; TunnelRefused with the gateway's status line."""
    parts = urlsplit(proxy)
    if not parts.hostname:
        raise TunnelRefused(f"the proxy URL {parts.scheme}://{parts.netloc} names no host")
    sock = socket.create_connection((parts.hostname, parts.port or 3128), timeout=timeout)
    sock.sendall(connect_request(host, port, proxy))
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
        if len(head) > 65536:
            break
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    if status.split(" ")[1:2] != ["200"]:
        sock.close()
        raise TunnelRefused(status or "the gateway closed the connection")
    sock.settimeout(None)
    rest = head.split(b"\r\n\r\n", 1)[1]
    if rest:
        os.write(1, rest)
    return sock


def pump(sock: socket.socket, stdin: int = 0, stdout: int = 1) -> None:
    """Copy stdin to the socket and the socket to stdout until both ends are done."""
    open_in = True
    while True:
        watched: list[int] = [sock.fileno(), stdin] if open_in else [sock.fileno()]
        readable, _, _ = select.select(watched, [], [])
        if stdin in readable:
            data = os.read(stdin, _CHUNK)
            if data:
                sock.sendall(data)
            else:
                open_in = False
                sock.shutdown(socket.SHUT_WR)
        if sock.fileno() in readable:
            data = sock.recv(_CHUNK)
            if not data:
                return
            os.write(stdout, data)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if env is None else env
    if len(args) != 2 or not args[1].isdigit():
        print("usage: corral-proxy-tunnel HOST PORT", file=sys.stderr)
        return 2
    proxy = environ.get("HTTPS_PROXY") or environ.get("https_proxy")
    if not proxy:
        print("corral-proxy-tunnel: HTTPS_PROXY is not set", file=sys.stderr)
        return 2
    try:
        sock = open_tunnel(args[0], int(args[1]), proxy)
    except (OSError, TunnelRefused) as err:
        print(f"corral-proxy-tunnel: {args[0]}:{args[1]}: {err}", file=sys.stderr)
        return 1
    with sock:
        pump(sock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
