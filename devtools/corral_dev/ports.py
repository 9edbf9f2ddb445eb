"""A free TCP port for a test, a benchmark or a local stack: the one helper they all share."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at `host` now (the caller binds it soon after)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
