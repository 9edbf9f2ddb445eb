"""read, write, edit and glob: the model's file tools, worded here for either workspace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..ports import Workspace
from ._result import ToolRefused, ToolResult, cap_output

READ_MAX_LINES = 2000
READ_MAX_CHARS = 100_000
# A window of very long lines stops here; cap_output then keeps its head and tail.
READ_MAX_BYTES = 4 * READ_MAX_CHARS
EDIT_MAX_BYTES = 10 << 20
GLOB_MAX_RESULTS = 1000


async def read(ws: Workspace, args: dict[str, Any]) -> ToolResult:
    offset = max(1, int(args.get("offset", 1)))
    limit = max(1, min(int(args.get("limit", READ_MAX_LINES)), READ_MAX_LINES))
    window = await ws.read_lines(args["path"], offset, limit, READ_MAX_BYTES)
    chosen = window.lines
    body = "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(chosen, start=offset))
    if window.clipped:
        last = offset + len(chosen) - 1
        body += (
            f"\n[the window stops at {READ_MAX_BYTES} bytes; line {last} may be cut; read on "
            f"with offset={last}, or use bash for very long lines]"
        )
    elif window.more:
        body += f"\n[more lines follow; read again with offset={offset + len(chosen)}]"
    if not chosen:
        body = "[empty file]" if offset == 1 else f"[the file has fewer than {offset} lines]"
    return ToolResult(cap_output(body, READ_MAX_CHARS))


async def write(ws: Workspace, args: dict[str, Any]) -> ToolResult:
    content: str = args["content"]
    written = await ws.write_text(args["path"], content)
    return ToolResult(f"wrote {len(content.encode())} bytes to {written}")


async def edit(ws: Workspace, args: dict[str, Any]) -> ToolResult:
    old: str = args["old_string"]
    new: str = args["new_string"]
    if not old:
        raise ToolRefused("old_string must not be empty")
    text = await ws.read_text(args["path"], EDIT_MAX_BYTES)
    count = text.count(old)
    if count == 0:
        raise ToolRefused(f"old_string was not found in {args['path']!r}")
    if count > 1 and not args.get("replace_all", False):
        raise ToolRefused(
            f"old_string occurs {count} times in {args['path']!r}; give more context or set "
            "replace_all"
        )
    written = await ws.write_text(args["path"], text.replace(old, new))
    return ToolResult(f"replaced {count} occurrence(s) in {written}")


async def glob(ws: Workspace, args: dict[str, Any]) -> ToolResult:
    pattern: str = args["pattern"]
    if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
        raise ToolRefused("glob patterns are relative to the search path and may not use '..'")
    found = await ws.glob(args.get("path") or ".", pattern, GLOB_MAX_RESULTS)
    lines = list(found.matches)
    if found.more:
        lines.append(f"[stopped at {GLOB_MAX_RESULTS} results]")
    return ToolResult("\n".join(lines) if lines else "no files matched")
