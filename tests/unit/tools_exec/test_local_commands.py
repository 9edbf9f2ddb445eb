"""The in-process workspace's commands, both ways it can wait for them: on a pidfd (Linux 5.3
and later: no thread per command) and through asyncio's own subprocess support (elsewhere)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from corral_harness.tools import _local, run_command

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["pidfd", "asyncio"])
def waiting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "pidfd" and not _local._pidfd_usable():
        pytest.fail("this kernel has no pidfd_open: the pidfd path cannot be checked here")
    if request.param == "asyncio":
        monkeypatch.setattr(_local, "_pidfd_usable", lambda: False)
    return str(request.param)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0): it is gone once its state says so.
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")


async def _until_gone(child: int, what: str) -> None:
    deadline = time.monotonic() + 5
    while not _gone(child):
        assert time.monotonic() < deadline, f"the command's child outlived {what}"
        await asyncio.sleep(0.02)


async def test_output_exit_code_and_signals(waiting: str, tmp_path: Path) -> None:
    done = await run_command(["/bin/sh", "-c", "pwd; echo err >&2; exit 3"], str(tmp_path), 10)
    assert (done.exit_code, done.timed_out) == (3, False)
    assert done.output == f"{tmp_path}\nerr\n"
    killed = await run_command(["/bin/sh", "-c", "kill -TERM $$"], str(tmp_path), 10)
    assert killed.exit_code == -15


async def test_a_missing_program_or_directory_raises(waiting: str, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await run_command([str(tmp_path / "no-such-program")], str(tmp_path), 10)
    with pytest.raises(FileNotFoundError):
        await run_command(["/bin/true"], str(tmp_path / "no-such-dir"), 10)


async def test_the_output_is_read_to_its_end_even_after_the_exit(
    waiting: str, tmp_path: Path
) -> None:
    """A background child still holding the output: the command is over when it lets go."""
    started = time.monotonic()
    done = await run_command(
        ["/bin/sh", "-c", "(sleep 0.3; echo late) & echo early"], str(tmp_path), 10
    )
    assert done.output == "early\nlate\n"
    assert time.monotonic() - started >= 0.3


async def test_a_timeout_kills_the_group_and_keeps_the_output(waiting: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 30 & echo $! > {pidfile}; echo before; wait"
    done = await run_command(["/bin/sh", "-c", script], str(tmp_path), 0.5)
    assert (done.exit_code, done.timed_out) == (-9, True)
    assert done.output == "before\n"
    await _until_gone(int(pidfile.read_text()), "the timeout")


async def test_cancelling_kills_the_group(waiting: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 30 & echo $! > {pidfile}; wait"
    task = asyncio.create_task(run_command(["/bin/sh", "-c", script], str(tmp_path), 60))
    # Deadlines from each step's own start: a loaded machine may take seconds to start `sh`.
    deadline = time.monotonic() + 15
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await _until_gone(int(pidfile.read_text()), "the cancellation")


async def test_a_flood_is_held_to_its_head_and_tail(waiting: str, tmp_path: Path) -> None:
    script = "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo the-end"
    done = await run_command(["/bin/sh", "-c", script], str(tmp_path), 30, keep_bytes=1000)
    assert done.output.startswith("x" * 500)
    assert done.output.endswith("the-end\n")
    assert len(done.output) < 2000


async def test_no_thread_waits_for_a_command_on_a_pidfd(waiting: str, tmp_path: Path) -> None:
    before = {t.ident for t in threading.enumerate()}
    task = asyncio.create_task(run_command(["/bin/sleep", "0.5"], str(tmp_path), 10))
    await asyncio.sleep(0.2)
    added = [t.name for t in threading.enumerate() if t.ident not in before]
    await task
    if waiting == "pidfd":
        assert added == []
    else:  # asyncio's child watcher: a thread per child
        assert added


async def test_a_cancellation_while_asyncio_still_creates_the_process_kills_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncio's process creation awaits after the fork (pipes, watcher): a cancellation then
    must still kill the group it started (it leaked, and a loaded machine showed it)."""
    monkeypatch.setattr(_local, "_pidfd_usable", lambda: False)
    pidfile = tmp_path / "child.pid"
    real = asyncio.create_subprocess_exec
    forked = asyncio.Event()

    async def slow_after_the_fork(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        proc = await real(*args, **kwargs)
        forked.set()
        await asyncio.sleep(2)  # still creating, as far as the caller knows
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", slow_after_the_fork)
    script = f"sleep 30 & echo $! > {pidfile}; wait"
    task = asyncio.create_task(run_command(["/bin/sh", "-c", script], str(tmp_path), 60))
    await asyncio.wait_for(forked.wait(), 15)
    deadline = time.monotonic() + 15
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await _until_gone(int(pidfile.read_text()), "the cancellation")
