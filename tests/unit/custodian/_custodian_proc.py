"""Run `corral-custodian` as a real process for a test, and stop it after."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

CUSTODIAN = Path(sys.executable).parent / "corral-custodian"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_custodian(env: dict[str, str], log: Path) -> Iterator[str]:
    """Start the custodian with exactly `env` (plus PATH) and yield its URL once ready."""
    port = free_port()
    full_env = {
        "PATH": os.environ.get("PATH", ""),
        "CORRAL_CUSTODIAN_ADDR": f"127.0.0.1:{port}",
        **env,
    }
    with log.open("ab") as out:
        process = subprocess.Popen([str(CUSTODIAN)], env=full_env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"custodian exited {process.returncode}: {log.read_text()}")
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"custodian not ready: {log.read_text()}")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
