"""Start the local parts of a session (scripted model, custodian, harness) as real processes.

Each listens on a free loopback port, logs to `<state dir>/logs/<name>.log`, and runs in its own
session (process group) so a Ctrl-C at the terminal reaches `corral run` alone: the turn is then
aborted through the wire, while the harness is still there to settle it. On Linux each part is
also told to end when `corral run` ends, however it ends, so none is left behind.

As in a sandbox pod, the custodian answers only the harness's pod-local credential: one random
credential per run, in a 0600 file under `<state dir>/secrets/`, is handed to both
(`CORRAL_CUSTODIAN_CREDENTIAL_FILE`) by `Parts.start`.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from corral_common.asgi import LISTEN_FD_ENV

from ._localpaths import write_secret
from ._providers_local import CREDENTIAL_VARIABLES

READY_TIMEOUT = 30.0
CREDENTIAL_ENV = "CORRAL_CUSTODIAN_CREDENTIAL_FILE"
# The model the scripted demo server plays; a run against it drives the session with it.
SCRIPTED_MODEL = "corral-scripted"


class StartFailed(Exception):
    """A part did not come up; the message carries the end of its log."""


def _die_with_parent() -> None:
    """In the child: ask Linux to kill it when `corral run` dies without stopping it.

    SIGKILL, not SIGTERM: a part that is shutting down gracefully waits for its open requests
    (a long-poll, a slow model stream), and nobody is left to wait for it. The harness writes
    its conversations as it goes, so a kill loses nothing it had recorded.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def listening_socket() -> socket.socket:
    """A loopback socket, bound to a port the kernel chose and listening, for a part to
    inherit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _entry(module: str) -> list[str]:
    """Run a console script's `main` with this interpreter, so the venv is the same."""
    return [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())"]


@dataclass
class Part:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    argv: list[str] = field(default_factory=list)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class Parts:
    """The processes of one run, stopped together."""

    log_dir: Path
    running: list[Part] = field(default_factory=list)
    credential_file: Path | None = None

    def custodian_credential(self) -> Path:
        """This run's pod-local credential, created on first use: random, in a 0600 file."""
        if self.credential_file is None:
            path = self.log_dir.parent / "secrets" / "custodian-credential"
            self.credential_file = write_secret(path, secrets.token_urlsafe(32))
        return self.credential_file

    def _pod_env(self, argv: list[str], env: dict[str, str]) -> dict[str, str]:
        """What the custodian and a harness that talks to it need to find each other."""
        if argv == part_argv(CUSTODIAN):
            extra = {CREDENTIAL_ENV: str(self.custodian_credential())}
            upstream = env.get("CORRAL_UPSTREAM_URL")
            scripted = [p for p in self.running if SCRIPTED in p.argv and p.url == upstream]
            if scripted and "CORRAL_MODEL_OVERRIDE" not in env:
                # `corral run` drives a session against the scripted model with the model
                # override corral-scripted; the custodian allows the Agent's model and that.
                extra["CORRAL_MODEL_OVERRIDE"] = SCRIPTED_MODEL
            return env | extra
        if argv == part_argv(HARNESS) and env.get("CORRAL_CUSTODIAN_URL"):
            return env | {CREDENTIAL_ENV: str(self.custodian_credential())}
        return env

    def start(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        port: int | None = None,
        *,
        listener: socket.socket | None = None,
    ) -> Part:
        """Start a part that serves on `port`, or on `listener` (which it inherits; this
        process's copy is closed once the part has it)."""
        env = self._pod_env(argv, env)
        fds: tuple[int, ...] = ()
        if listener is not None:
            port = int(listener.getsockname()[1])
            fds = (listener.fileno(),)
            env = env | {LISTEN_FD_ENV: str(listener.fileno())}
        assert port is not None, "a part serves on a port or a listener"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                argv,
                env=env,
                pass_fds=fds,
                # Never the person's directory (often the workspace): whatever a part writes
                # relative to its working directory stays with the run's state.
                cwd=self.log_dir.parent,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # corral run starts no threads that fork
            )
        if listener is not None:
            listener.close()  # the part holds it now
        part = Part(name, f"http://127.0.0.1:{port}", process, log, argv)
        self.running.append(part)
        return part

    async def wait_ready(self, part: Part, path: str = "/readyz") -> float:
        """Poll until `path` answers 200; return the seconds it took."""
        began = time.monotonic()
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                if part.process.poll() is not None:
                    raise StartFailed(
                        f"the {part.name} exited with code {part.process.returncode} before it "
                        f"was ready; its log ({part.log}) ends with:\n{part.log_tail()}"
                    )
                try:
                    response = await http.get(part.url + path)
                    if response.status_code == 200:
                        return time.monotonic() - began
                except httpx.TransportError:
                    pass
                if time.monotonic() - began > READY_TIMEOUT:
                    raise StartFailed(
                        f"the {part.name} was not ready after {READY_TIMEOUT:.0f} s; its log "
                        f"({part.log}) ends with:\n{part.log_tail()}"
                    )
                await asyncio.sleep(0.05)

    def stop(self, grace: float = 5.0) -> None:
        """Stop the parts in the reverse of their start, each gone before the next is told:
        the harness's last spans reach the custodian's trace relay while it still listens."""
        for part in reversed(self.running):
            if part.process.poll() is None:
                part.process.send_signal(signal.SIGTERM)
            try:
                part.process.wait(grace)
            except subprocess.TimeoutExpired:
                part.process.kill()
                part.process.wait()
        self.running.clear()

    def kill(self) -> None:
        """No more grace (a Ctrl-C while they stop): every part still running is killed now;
        `stop` then finds them gone."""
        for part in self.running:
            if part.process.poll() is None:
                part.process.kill()


def base_env(drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment without the model key, the model endpoint and the cloud
    credentials.

    Every part gets only what it is given on purpose: the key goes to the custodian alone.
    """
    hidden = {
        "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL",
        # A cloud provider's credential (docs/providers.md): the custodian's alone.
        *CREDENTIAL_VARIABLES, *drop,
    }  # fmt: skip
    return {k: v for k, v in os.environ.items() if k not in hidden and not k.startswith("CORRAL_")}


HARNESS = "corral_harness.main"
CUSTODIAN = "corral_custodian.main"
SCRIPTED = "corral_dev.scripted"


def scripted_argv(port: int, script: Path) -> list[str]:
    return [sys.executable, "-m", SCRIPTED, "--port", str(port), "--script", str(script)]


def part_argv(module: str) -> list[str]:
    return _entry(module)
