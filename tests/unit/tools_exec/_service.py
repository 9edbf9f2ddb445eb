"""A real corral-exec service for tests (the conformance suite and the wire test), and a way
to tell whether a process the agent started is gone."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx

from corral_dev.execbin import exec_binary


class ExecService:
    """A running `corral-exec serve` on a socket in a temporary directory."""

    def __init__(self, root: Path, socket: Path, env: dict[str, str]) -> None:
        self.socket = socket
        self.proc = subprocess.Popen(
            [str(exec_binary()), "serve", "--socket", str(socket), "--root", str(root)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 20
        transport = httpx.HTTPTransport(uds=str(socket))
        with httpx.Client(transport=transport, base_url="http://exec") as client:
            while True:
                assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "corral-exec did not answer"
                time.sleep(0.02)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def pid_dead(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].startswith("Z")


def wait_dead(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pid_dead(pid):
            return True
        time.sleep(0.02)
    return False
