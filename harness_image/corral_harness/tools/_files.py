"""read, write, edit and glob: file tools confined to the granted root."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..paths import GrantedRoot, PathOutsideRoot, PathVerdict
from ._result import ToolRefused, ToolResult, cap_output

READ_MAX_LINES = 2000
READ_MAX_CHARS = 100_000
GLOB_MAX_RESULTS = 1000


def inside(root: GrantedRoot, path: str) -> Path:
    """The resolved path, or a refusal that names the path and the root."""
    try:
        return root.resolve(path)
    except PathOutsideRoot as exc:
        if root.classify(path) is PathVerdict.UNCERTAIN:
            raise ToolRefused(
                f"path {path!r} cannot be resolved with certainty inside the granted root "
                f"{str(root.root)!r}; refused"
            ) from exc
        raise ToolRefused(str(exc)) from exc


def read(root: GrantedRoot, args: dict[str, Any]) -> ToolResult:
    path = inside(root, args["path"])
    if not path.is_file():
        raise ToolRefused(f"{args['path']!r} is not a file")
    offset = max(1, int(args.get("offset", 1)))
    limit = max(1, min(int(args.get("limit", READ_MAX_LINES)), READ_MAX_LINES))
    chosen: list[str] = []
    more = False
    # Streamed, so a huge file costs only the lines up to the window (and one past it).
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, start=1):
            if number < offset:
                continue
            if len(chosen) == limit:
                more = True
                break
            chosen.append(line.rstrip("\n"))
    body = "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(chosen, start=offset))
    if more:
        body += f"\n[more lines follow; read again with offset={offset + len(chosen)}]"
    if not chosen:
        body = "[empty file]" if offset == 1 else f"[the file has fewer than {offset} lines]"
    return ToolResult(cap_output(body, READ_MAX_CHARS))


def write(root: GrantedRoot, args: dict[str, Any]) -> ToolResult:
    path = inside(root, args["path"])
    if path.is_dir():
        raise ToolRefused(f"{args['path']!r} is a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    # The parent may have been created through a path that only now resolves; check again.
    path = inside(root, str(path))
    content: str = args["content"]
    path.write_text(content, encoding="utf-8")
    return ToolResult(f"wrote {len(content.encode())} bytes to {root.relative(path)}")


def edit(root: GrantedRoot, args: dict[str, Any]) -> ToolResult:
    path = inside(root, args["path"])
    if not path.is_file():
        raise ToolRefused(f"{args['path']!r} is not a file")
    old: str = args["old_string"]
    new: str = args["new_string"]
    if not old:
        raise ToolRefused("old_string must not be empty")
    text = path.read_text(encoding="utf-8")
    count = text.count(old)
    if count == 0:
        raise ToolRefused(f"old_string was not found in {args['path']!r}")
    if count > 1 and not args.get("replace_all", False):
        raise ToolRefused(
            f"old_string occurs {count} times in {args['path']!r}; give more context or set "
            "replace_all"
        )
    path.write_text(text.replace(old, new), encoding="utf-8")
    return ToolResult(f"replaced {count} occurrence(s) in {root.relative(path)}")


def glob(root: GrantedRoot, args: dict[str, Any]) -> ToolResult:
    pattern: str = args["pattern"]
    if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
        raise ToolRefused("glob patterns are relative to the search path and may not use '..'")
    base = inside(root, args.get("path", "."))
    found: list[str] = []
    for match in sorted(base.glob(pattern)):
        # A symlink inside the root may point out of it; such matches are not shown.
        real = Path(os.path.realpath(match))
        if not real.is_relative_to(root.root) or ".git" in match.relative_to(root.root).parts:
            continue
        found.append(str(match.relative_to(root.root)))
        if len(found) >= GLOB_MAX_RESULTS:
            found.append(f"[stopped at {GLOB_MAX_RESULTS} results]")
            break
    return ToolResult("\n".join(found) if found else "no files matched")
