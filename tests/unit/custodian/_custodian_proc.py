"""Run `corral-custodian` as a real process for a test, and stop it after; and a git daemon to
push to, since the custodian refuses local-path remotes."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from corral_dev.ports import free_port

CUSTODIAN = Path(sys.executable).parent / "corral-custodian"


@dataclass(frozen=True)
class Custodian:
    """A running custodian: its harness-facing URL with the credential, and its operator port."""

    url: str
    credential: str
    operator_url: str | None
    wire_token: str | None
    log: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.credential}"}

    def client(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def usage(self) -> dict[str, object]:
        assert self.operator_url is not None and self.wire_token is not None
        response = httpx.get(
            self.operator_url + "/v1/usage",
            headers={"authorization": f"Bearer {self.wire_token}"},
            timeout=10,
        )
        assert response.status_code == 200, response.text
        body: dict[str, object] = response.json()
        return body


def _secret_file(path: Path) -> str:
    if not path.exists():
        path.write_text(secrets.token_urlsafe(32) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


@contextmanager
def running_custodian(
    env: dict[str, str], log: Path, *, operator: bool = True, ready_timeout: float = 60
) -> Iterator[Custodian]:
    """Start the custodian with exactly `env` (plus PATH, a credential file and, with
    `operator`, an operator port and wire token) and yield it once ready. The credential and
    wire token live beside the log, so a restart with the same log reuses them."""
    port = free_port()
    full_env = {"PATH": os.environ.get("PATH", ""), "CORRAL_CUSTODIAN_ADDR": f"127.0.0.1:{port}"}
    credential = ""
    if "CORRAL_CUSTODIAN_CREDENTIAL_FILE" not in env and "CORRAL_CUSTODIAN_INSECURE" not in env:
        cred_file = log.parent / f"{log.stem}-credential"
        credential = _secret_file(cred_file)
        full_env["CORRAL_CUSTODIAN_CREDENTIAL_FILE"] = str(cred_file)
    elif "CORRAL_CUSTODIAN_CREDENTIAL_FILE" in env:
        credential = Path(env["CORRAL_CUSTODIAN_CREDENTIAL_FILE"]).read_text().strip()
    operator_url = wire_token = None
    if operator and "CORRAL_CUSTODIAN_OPERATOR_ADDR" not in env:
        op_port = free_port()
        token_file = log.parent / f"{log.stem}-wire-token"
        wire_token = _secret_file(token_file)
        full_env["CORRAL_CUSTODIAN_OPERATOR_ADDR"] = f"127.0.0.1:{op_port}"
        full_env["CORRAL_WIRE_TOKEN_FILE"] = str(token_file)
        operator_url = f"http://127.0.0.1:{op_port}"
    full_env.update(env)
    with log.open("ab") as out:
        process = subprocess.Popen([str(CUSTODIAN)], env=full_env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout
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
        yield Custodian(url, credential, operator_url, wire_token, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def git_daemon(base: Path) -> Iterator[str]:
    """`git daemon` serving the bare repositories under `base` (push enabled); yields the
    git:// URL prefix, e.g. `git://127.0.0.1:PORT/`."""
    port = free_port()
    process = subprocess.Popen(
        [
            "git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack",
            f"--base-path={base}", "--listen=127.0.0.1", f"--port={port}", str(base),
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(base)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                assert process.poll() is None, "git daemon exited"
                assert time.monotonic() < deadline, "git daemon did not start"
                time.sleep(0.05)
        yield f"git://127.0.0.1:{port}/"
    finally:
        process.terminate()
        process.wait(timeout=10)


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_AUTHOR_NAME": "t",
             "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
             "GIT_CONFIG_NOSYSTEM": "1"},
    )  # fmt: skip
    return done.stdout.strip()
