"""bash and grep: commands run in the workspace with the granted root as cwd."""

from __future__ import annotations

from typing import Any

from ..paths import PathVerdict
from ..ports import Workspace, WorkspaceError
from ._result import ToolRefused, ToolResult, cap_output

GREP_MAX_CHARS = 30_000
KEEP_BYTES = 1_000_000  # of a command's output, held as its head and its tail


async def bash(
    ws: Workspace, args: dict[str, Any], *, default_timeout: float, output_cap: int
) -> ToolResult:
    command: str = args["command"]
    timeout = float(args.get("timeout", default_timeout))
    timeout = max(1.0, min(timeout, 600.0))
    shell = (await ws.programs()).shell
    outcome = await ws.run([shell, "-c", command], timeout=timeout, keep_bytes=KEEP_BYTES)
    body = cap_output(outcome.output, output_cap)
    if outcome.timed_out:
        return ToolResult(f"{body}\n[command timed out after {timeout:g} s and was killed]", True)
    if outcome.exit_code != 0:
        return ToolResult(f"{body}\n[exit code {outcome.exit_code}]", True)
    return ToolResult(body)


async def grep(ws: Workspace, args: dict[str, Any], *, timeout: float) -> ToolResult:
    path = args.get("path") or "."
    target = await ws.resolve(path)
    if target.verdict is PathVerdict.OUTSIDE:
        raise WorkspaceError("outside")
    if target.verdict is PathVerdict.UNCERTAIN:
        raise WorkspaceError("uncertain")
    rg = (await ws.programs()).ripgrep
    if rg is None:
        raise ToolRefused("ripgrep (rg) is not installed in this sandbox")
    # Sorted, so the answer (and what a cap keeps of it) does not depend on thread timing.
    argv = [rg, "--line-number", "--no-heading", "--color", "never", "--max-columns", "500"]
    argv += ["--sort", "path"]
    if args.get("ignore_case"):
        argv.append("--ignore-case")
    if args.get("glob"):
        argv += ["--glob", str(args["glob"])]
    argv += ["--regexp", str(args["pattern"]), "--", target.path]
    try:
        outcome = await ws.run(argv, timeout=timeout, keep_bytes=KEEP_BYTES)
    except WorkspaceError as exc:
        if exc.kind == "no_program":
            raise ToolRefused("ripgrep (rg) is not installed in this sandbox") from exc
        raise
    if outcome.timed_out:
        return ToolResult("[search timed out]", True)
    if outcome.exit_code == 1:
        return ToolResult("no matches")
    if outcome.exit_code != 0:
        return ToolResult(cap_output(outcome.output, GREP_MAX_CHARS), True)
    return ToolResult(cap_output(outcome.output, GREP_MAX_CHARS))
