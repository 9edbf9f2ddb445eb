"""`corral run`'s harness and custodian serve on sockets `corral run` bound and handed down
(CORRAL_LISTEN_FD): the port is held from before the part starts, so no other process can
take it in between and be spoken to instead (two runs side by side once were: a run's driver
posted its turn to another run's custodian, 401)."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest

from corral_cli import _processes as proc

pytestmark = pytest.mark.timeout(60)


async def test_the_harness_serves_on_the_socket_it_inherits(tmp_path: Path) -> None:
    parts = proc.Parts(tmp_path / "logs")
    listener = proc.listening_socket()
    port = listener.getsockname()[1]
    # Held from now on: nothing else can bind it, before or while the harness starts.
    with socket.socket() as other, pytest.raises(OSError) as taken:
        other.bind(("127.0.0.1", port))
    assert taken.value.errno == errno.EADDRINUSE
    env = proc.base_env() | {
        "CORRAL_HARNESS_ADDR": "127.0.0.1:1",  # ignored: the inherited socket is served
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        "CORRAL_GRANTED_ROOT": str(tmp_path),
    }
    try:
        harness = parts.start("harness", proc.part_argv(proc.HARNESS), env, listener=listener)
        assert harness.url == f"http://127.0.0.1:{port}"
        assert listener.fileno() == -1  # this process's copy is closed: the harness holds it
        await parts.wait_ready(harness)
    finally:
        parts.stop()
