"""Which tools the model sees and whether one call may run: pure rules, no I/O but path checks,
which ask the workspace (`PathClassifier`): in a pod that is the tools container's exec service.

Order of the checks in `decide`: the fixed rule, the allowlist (default deny; deny beats allow,
also under `*`), read-only, the live list of this step, the granted root, then the actions that
always ask. Hooks run before these, so a rewritten input is checked like any other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Final

from corral_common.toolmatch import allowed_by_patterns
from corral_common.toolmatch import matches as _matches

from ..paths import PathVerdict
from ..ports import PathClassifier, ToolCall, ToolDecision, ToolSpec
from .always_ask import ask_reason
from .fixed_rule import forbidden_reason
from .shell_paths import check_shell_paths
from .tool_search import TOOL_SEARCH, TOOL_SEARCH_NAME

MAX_VISIBLE_TOOLS: Final = 128
MAX_DESCRIPTION_CHARS: Final = 200
WRITE_TOOLS: Final = frozenset({"write", "edit", "bash"})
# Input keys that name files or directories, for every tool.
PATH_KEYS: Final = ("path", "file_path", "cwd", "directory", "dir", "target")


def writes(spec_or_name: ToolSpec | str) -> bool:
    if isinstance(spec_or_name, ToolSpec):
        return spec_or_name.writes or spec_or_name.name in WRITE_TOOLS
    return spec_or_name in WRITE_TOOLS


def one_line(description: str) -> str:
    line = description.strip().split("\n", 1)[0]
    return line if len(line) <= MAX_DESCRIPTION_CHARS else line[: MAX_DESCRIPTION_CHARS - 1] + "…"


def filter_catalog(
    catalog: Sequence[ToolSpec],
    allow: Sequence[str],
    deny: Sequence[str],
    *,
    read_only: bool,
) -> list[ToolSpec]:
    """The tools shown this step, tool search first, in catalog order, at most 128."""
    shown: list[ToolSpec] = [TOOL_SEARCH]
    seen = {TOOL_SEARCH_NAME}
    for spec in catalog:
        if spec.name in seen or forbidden_reason(spec.name):
            continue
        if not allowed_by_patterns(spec.name, allow, deny):
            continue
        if read_only and writes(spec):
            continue
        seen.add(spec.name)
        shown.append(dataclasses.replace(spec, description=one_line(spec.description)))
        if len(shown) == MAX_VISIBLE_TOOLS:
            break
    return shown


def _paths(tool_input: dict[str, Any]) -> list[object]:
    found: list[object] = [tool_input[k] for k in PATH_KEYS if tool_input.get(k) is not None]
    paths = tool_input.get("paths")
    if isinstance(paths, list):
        found.extend(paths)
    return found


async def check_glob(root: PathClassifier, pattern: str) -> ToolDecision | None:
    """A glob pattern's fixed prefix must stay inside; `..` after a wildcard cannot be known."""
    parts = pattern.split("/")
    fixed: list[str] = []
    for i, part in enumerate(parts):
        if any(c in part for c in "*?[{"):
            if ".." in parts[i:]:
                return ToolDecision("ask", f"glob {pattern!r} climbs with '..' after a wildcard")
            break
        fixed.append(part)
    prefix = "/".join(fixed) or "."
    if pattern.startswith("/") and not prefix.startswith("/"):
        prefix = "/" + prefix
    verdict = await root.classify(prefix)
    if verdict is PathVerdict.OUTSIDE:
        return ToolDecision("deny", f"glob {pattern!r} reaches outside the granted root")
    if verdict is PathVerdict.UNCERTAIN:
        return ToolDecision("ask", f"glob {pattern!r} may leave the granted root")
    return None


async def check_paths(root: PathClassifier, tool_input: dict[str, Any]) -> ToolDecision | None:
    for path in _paths(tool_input):
        if not isinstance(path, str):
            return ToolDecision("ask", f"path argument {path!r} is not a string")
        verdict = await root.classify(path)
        if verdict is PathVerdict.OUTSIDE:
            return ToolDecision("deny", f"path {path!r} is outside the granted root")
        if verdict is PathVerdict.UNCERTAIN:
            return ToolDecision("ask", f"path {path!r} may leave the granted root")
    return None


async def decide(
    call: ToolCall,
    *,
    allow: Sequence[str],
    deny: Sequence[str],
    visible: Sequence[ToolSpec] | None,
    read_only: bool,
    root: PathClassifier,
) -> ToolDecision:
    reason = forbidden_reason(call.name)
    if reason:
        return ToolDecision("deny", reason)
    if call.name != TOOL_SEARCH_NAME:
        if _matches(call.name, deny):
            return ToolDecision("deny", f"{call.name} is denied by the Agent's tools.deny")
        if not _matches(call.name, allow):
            return ToolDecision("deny", f"{call.name} is not in the Agent's tools.allow")
        spec = next((t for t in visible or () if t.name == call.name), None)
        if read_only and writes(spec or call.name):
            return ToolDecision(
                "deny", f"{call.name} writes or runs commands; this session is read-only"
            )
        if visible is not None and spec is None:
            return ToolDecision("deny", f"{call.name} is not on this step's tool list")
    path_decision = await check_paths(root, call.input)
    command = call.input.get("command")
    if path_decision is None and call.name == "bash" and isinstance(command, str):
        path_decision = await check_shell_paths(root, command)
    pattern = call.input.get("pattern")
    if path_decision is None and call.name == "glob" and isinstance(pattern, str):
        path_decision = await check_glob(root, pattern)
    if path_decision is not None:
        return path_decision
    reason = ask_reason(call.name, call.input)
    if reason:
        return ToolDecision("ask", reason)
    return ToolDecision("allow")
