"""bash and grep: commands run as child processes with the granted root as cwd."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..paths import GrantedRoot
from ._files import inside
from ._result import ToolRefused, ToolResult, cap_output

GREP_MAX_CHARS = 30_000

# Never handed to a command the model runs: the wire token is the operator's, and a model key
# has no business in the sandbox (it is the custodian's; this is defence in depth).
_HIDDEN_ENV = ("CORRAL_WIRE_TOKEN_FILE", "ANTHROPIC_API_KEY", "CORRAL_MODEL_KEY_FILE")


@dataclass(frozen=True)
class CommandOutcome:
    exit_code: int
    output: str
    timed_out: bool


def _child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _HIDDEN_ENV}


async def run_command(
    argv: list[str], cwd: str, timeout: float, *, keep_bytes: int = 1_000_000
) -> CommandOutcome:
    """Run argv in its own process group; kill the whole group on timeout or cancellation.

    Output is read as it comes and at most `keep_bytes` of it is held (its head and its tail),
    so a command that floods its output cannot exhaust the harness's memory.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=_child_env(),
        start_new_session=True,
    )
    assert proc.stdout is not None
    kept = _HeadTail(keep_bytes)
    stdout = proc.stdout

    async def drain() -> None:
        while chunk := await stdout.read(65536):
            kept.add(chunk)
        await proc.wait()

    try:
        await asyncio.wait_for(drain(), timeout)
    except TimeoutError:
        _kill_group(proc.pid)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 2)
        return CommandOutcome(-9, kept.text(), True)
    except BaseException:
        _kill_group(proc.pid)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 2)
        raise
    return CommandOutcome(proc.returncode or 0, kept.text(), False)


class _HeadTail:
    def __init__(self, limit: int) -> None:
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > self.half:
            self.dropped += len(self.tail) - self.half
            del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if not self.dropped:
            return head + tail
        return f"{head}\n[output truncated: {self.dropped} bytes cut]\n{tail}"


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def bash(
    root: GrantedRoot, args: dict[str, Any], *, default_timeout: float, output_cap: int
) -> ToolResult:
    command: str = args["command"]
    timeout = float(args.get("timeout", default_timeout))
    timeout = max(1.0, min(timeout, 600.0))
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    outcome = await run_command([shell, "-c", command], str(root.root), timeout)
    body = cap_output(outcome.output, output_cap)
    if outcome.timed_out:
        return ToolResult(f"{body}\n[command timed out after {timeout:g} s and was killed]", True)
    if outcome.exit_code != 0:
        return ToolResult(f"{body}\n[exit code {outcome.exit_code}]", True)
    return ToolResult(body)


@functools.cache
def ripgrep_binary() -> str:
    """`rg` from PATH (the image's package), else the one the `ripgrep` wheel put beside us."""
    found = shutil.which("rg")
    if found:
        return found
    beside = Path(sys.executable).parent / "rg"
    return str(beside) if beside.exists() else "rg"


async def grep(root: GrantedRoot, args: dict[str, Any], *, timeout: float) -> ToolResult:
    target = inside(root, args.get("path", "."))
    argv = [
        ripgrep_binary(),
        "--line-number",
        "--no-heading",
        "--color",
        "never",
        "--max-columns",
        "500",
    ]
    if args.get("ignore_case"):
        argv.append("--ignore-case")
    if args.get("glob"):
        argv += ["--glob", str(args["glob"])]
    argv += ["--regexp", str(args["pattern"]), "--", root.relative(target)]
    try:
        outcome = await run_command(argv, str(root.root), timeout)
    except FileNotFoundError as exc:
        raise ToolRefused("ripgrep (rg) is not installed in this sandbox") from exc
    if outcome.timed_out:
        return ToolResult("[search timed out]", True)
    if outcome.exit_code == 1:
        return ToolResult("no matches")
    if outcome.exit_code != 0:
        return ToolResult(cap_output(outcome.output, GREP_MAX_CHARS), True)
    return ToolResult(cap_output(outcome.output, GREP_MAX_CHARS))
