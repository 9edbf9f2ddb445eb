"""corral-gateway stopped mid-stream (a rollout, `helm upgrade`, a node drain: SIGTERM): it says
it is not ready, takes no new connection, closes a tunnel that carries nothing and lets a busy
one (a model's answer streaming) finish before it exits. The process, a real tunnel from a
bound source address, and destinations on loopback: one that streams a line every 0.1 s, one
that never speaks (a keep-alive connection whose request is answered)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ._gateway import binding, start_gateway, tunnel, write_bindings

pytestmark = pytest.mark.timeout(60)

AGENT_IP, DEST_IP = "127.0.0.10", "127.0.0.2"
LINES, EVERY = 40, 0.1  # the streaming answer: 4 s, longer than the quiet a tunnel may keep
QUIET = 2  # --drain-quiet, seconds


def _listen() -> socket.socket:
    server = socket.socket()
    server.bind((DEST_IP, 0))
    server.listen()
    return server


def _serve(server: socket.socket, lines: int) -> None:
    """Each connection: `lines` lines, one every EVERY seconds (0: hold it open, silent)."""

    def answer(conn: socket.socket) -> None:
        with conn:
            if lines == 0:
                conn.recv(1)  # until the other side closes
                return
            for i in range(lines):
                time.sleep(EVERY)
                conn.sendall(f"line {i}\n".encode())

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


@pytest.fixture
def destinations() -> Iterator[tuple[int, int]]:
    busy, quiet = _listen(), _listen()
    _serve(busy, LINES)
    _serve(quiet, 0)
    yield busy.getsockname()[1], quiet.getsockname()[1]
    busy.close()
    quiet.close()


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(20)
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def test_a_stopped_gateway_lets_a_streaming_tunnel_finish_and_closes_a_quiet_one(
    tmp_path: Path, destinations: tuple[int, int]
) -> None:
    busy, quiet = destinations
    bindings = tmp_path / "bindings.json"
    rules = [{"cidr": f"{DEST_IP}/32", "ports": [busy, quiet]}]
    sandbox = binding(namespace="team-a", session="s1", agent="coder", agent_rules=rules)
    write_bindings(bindings, [(AGENT_IP, "pod-1", sandbox)])
    gateway = start_gateway(tmp_path, [
        "--bindings-file", str(bindings), "--allow-range", f"{DEST_IP}/32",
        "--drain-quiet", f"{QUIET}s", "--drain-timeout", "30s",
    ])  # fmt: skip
    try:
        with (
            tunnel(gateway.proxy_port, AGENT_IP, f"{DEST_IP}:{busy}") as streaming,
            tunnel(gateway.proxy_port, AGENT_IP, f"{DEST_IP}:{quiet}") as idle,
        ):
            streaming.settimeout(5)
            first = streaming.recv(64)
            assert first.startswith(b"line 0"), first
            stopped = time.monotonic()
            gateway.proc.send_signal(signal.SIGTERM)

            # Not ready, and no new connection is taken.
            deadline = time.monotonic() + 5
            while gateway.admin_get("/readyz").status_code == 200:
                assert time.monotonic() < deadline, "still ready after SIGTERM"
                time.sleep(0.05)
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", gateway.proxy_port), 2, (AGENT_IP, 0))

            # The silent tunnel is closed after about QUIET; the streaming one carries on.
            idle.settimeout(QUIET + 6)
            assert idle.recv(64) == b""
            closed_quiet = time.monotonic() - stopped
            rest = _read_all(streaming)
            lines = (first + rest).decode().splitlines()
            assert lines == [f"line {i}" for i in range(LINES)]
            streamed = time.monotonic() - stopped
        assert QUIET <= closed_quiet < QUIET + 4, closed_quiet
        assert streamed > closed_quiet  # the busy one outlived the quiet one's closing
        assert gateway.proc.wait(timeout=10) == 0
        err = (tmp_path / f"gateway-{gateway.proxy_port}.err").read_text()
        assert '"tunnelsCutAtTheEnd":0' in err, err[-2000:]
    finally:
        gateway.stop()
    with pytest.raises(httpx.HTTPError):
        gateway.admin_get("/readyz")  # gone
