"""What keeps one `corral run` whole: its state directory is its own while it runs, and a
Ctrl-C at any moment ends it cleanly (docs/cli.md).

The lock. A run holds `fcntl.flock` on `<state dir>/corral-run.lock` (the file names its pid)
from before it writes anything there to its end; a second run on the same directory is refused
with that pid instead of overwriting the first's wire token. The kernel drops the lock when the
process goes, however it goes, so a directory whose run was killed resumes with `--state-dir`
as before: the file is left behind with the dead pid in it, and nothing reads that but people.

The interrupts. One handler serves SIGINT and SIGTERM for the whole run, in four modes:
preparing (the manifests, the clone: a Ctrl-C interrupts as Python's own would), starting (the
event loop being made: a Ctrl-C is held, and handed to the loop once it runs; raised in there,
it would leave a half-made loop behind), running (the event loop's turn: the run aborts the
turn through the wire, `LocalRun.on_interrupt`), and tearing down (stopping the parts, the
commit, the outcome line: a Ctrl-C is counted, the parts are killed rather than waited for, and
the outcome is still printed; the exit status is 130). Changing mode is setting an attribute,
so no signal finds Python's default handler in between.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Literal

from ._errors import CommandError

LOCK_FILE = "corral-run.lock"
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class StateLock:
    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = -1


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""


def lock_state_dir(state_dir: Path, named: str) -> StateLock:
    """Create `state_dir` if need be and hold its lock; a CommandError when it is not a
    directory, cannot be made, or another run holds it."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise CommandError(
            f"{named} {state_dir} is not a directory ({exc.filename} is a file)",
            "give a directory for the run's state (it is created if it does not exist)",
        ) from exc
    except OSError as exc:
        raise CommandError(
            f"{named} {state_dir} cannot be created: {exc.strerror or exc}",
            "choose a directory you may write, e.g. under $XDG_STATE_HOME",
        ) from exc
    path = state_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise CommandError(
            f"{named} {state_dir} cannot be written: {exc.strerror or exc}",
            "choose a directory you may write",
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(fd)
        os.close(fd)
        by = f"corral run (pid {pid})" if pid else "another corral run"
        raise CommandError(
            f"{named} {state_dir} is in use by {by}",
            "wait for that run to end (or stop it), or give another --state-dir",
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StateLock(path, fd)


Mode = Literal["preparing", "starting", "running", "tearing down"]


class Interrupts:
    """SIGINT and SIGTERM for one `corral run`, by mode (the module's docstring)."""

    def __init__(self, hurry: Callable[[], None], *, keep: bool = False) -> None:
        self.mode: Mode = "preparing"
        self.received = 0  # every interrupt, in any mode
        self._hurry = hurry
        self._keep = keep
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_running: Callable[[], None] | None = None
        self._held = 0  # interrupts while the loop was being made
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Interrupts:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._keep:
            # The process ends next: a late Ctrl-C changes nothing now. Ignored rather than left
            # to this handler, since Python's finalization puts back the default handler for a
            # Python one (a Ctrl-C then would kill the process by SIGINT, not exit 130).
            for ignored in SIGNALS:
                signal.signal(ignored, signal.SIG_IGN)
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]

    def starting(self) -> None:
        self.mode = "starting"

    def running(self, loop: asyncio.AbstractEventLoop, on_interrupt: Callable[[], None]) -> None:
        """Called on the running loop: from now on an interrupt is the loop's to handle."""
        self._loop, self._on_running = loop, on_interrupt
        self.mode = "running"
        for _ in range(self._held):
            loop.call_soon(on_interrupt)
        self._held = 0

    def tearing_down(self) -> None:
        self.mode = "tearing down"

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        if self.mode == "running" and self._loop is not None and self._on_running is not None:
            try:
                # Python runs this between two bytecodes of the loop's thread: the loop does
                # the work, as its own signal handler would.
                self._loop.call_soon_threadsafe(self._on_running)
                return
            except RuntimeError:  # the loop closed a moment ago
                self.mode = "tearing down"
        if self.mode == "preparing":
            self.mode = "tearing down"  # what follows the interrupt is the teardown
            raise KeyboardInterrupt
        if self.mode == "starting":
            self._held += 1
            return
        self._hurry()
