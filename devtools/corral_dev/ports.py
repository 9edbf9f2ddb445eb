"""A free TCP port for a test, a benchmark or a local stack: the one helper they all share.

A port asked of the kernel (bind to 0) is free when it is asked, not when the caller binds it
a moment later: on pytest-xdist workers a second worker could be handed the same port in
between, and a test then spoke to the other worker's harness (its readiness answered, its
model was another). So ports come from below the kernel's ephemeral range (which starts at
32768 here and on most Linux machines), from a block of their own per worker
(`PYTEST_XDIST_WORKER`), in turn from a random place in the block (a process the worker
starts inherits its block), each checked free before it is handed out.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import socket
import threading

# Below the kernel's ephemeral range, so no bind to port 0 anywhere takes one of these.
FIRST_PORT = 20000
BLOCK = 1400  # ports per worker: gw0 20000-21399, gw1 21400-22799, ... (8 workers fit)
MAX_WORKERS = 8

_lock = threading.Lock()
_next: itertools.cycle[int] | None = None


def _block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    found = re.fullmatch(r"gw(\d+)", worker)
    # The controller process and a run without workers take the last block.
    index = int(found.group(1)) % MAX_WORKERS if found else MAX_WORKERS
    start = FIRST_PORT + index * BLOCK
    return range(start, start + BLOCK)


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at `host` now, of this process's own block (the caller binds
    it soon after)."""
    global _next
    with _lock:
        if _next is None:
            block = _block()
            start = random.randrange(len(block))
            _next = itertools.cycle([*block[start:], *block[:start]])
        for _ in range(BLOCK):
            port = next(_next)
            if _bindable(host, port):
                return port
    # Every port of the block is taken (a leak somewhere): fall back to the kernel's choice.
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
