"""What the model reads from a working tool: the one place its words are made, for both the
in-process workspace and the exec service."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..ports import WorkspaceError, workspace_text


@dataclass(frozen=True)
class ToolResult:
    """What a tool call answers the model: text, and whether the call failed."""

    content: str
    is_error: bool = False


class ToolRefused(Exception):
    """A call the tool will not run (bad path, read-only session); its text goes to the model."""


def cap_output(text: str, limit: int) -> str:
    """Keep the head and the tail of a long output, with a marker saying what was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[output truncated: {cut} characters cut]\n{text[-tail:]}"


def head_tail_text(head: bytes, cut: int, tail: bytes) -> str:
    """A command's kept output: its head, a marker for the bytes dropped between, its tail."""
    if not cut:
        return workspace_text(head + tail)
    return f"{workspace_text(head)}\n[output truncated: {cut} bytes cut]\n{workspace_text(tail)}"


def refusal(tool: str, error: WorkspaceError, path: str, root: Path) -> str:
    """The model's words for a workspace operation that did not happen."""
    kind = error.kind
    if kind == "outside":
        return f"path {path!r} is outside the granted root {str(root)!r}"
    if kind == "uncertain":
        return (
            f"path {path!r} cannot be resolved with certainty inside the granted root "
            f"{str(root)!r}; refused"
        )
    if kind == "missing":
        return f"{path!r} does not exist"
    if kind == "not_file":
        return f"{path!r} is not a file"
    if kind == "not_dir":
        return f"{path!r} is not a directory"
    if kind == "is_dir":
        return f"{path!r} is a directory"
    if kind == "not_text":
        return f"{path!r} is not UTF-8 text"
    if kind == "too_large":
        return f"{path!r} is too large for {tool}"
    if kind == "no_program":
        return f"{tool} cannot run here: {error.detail}"
    if kind == "unavailable":
        return f"{tool} failed: the sandbox's tools service is unavailable ({error.detail})"
    return f"{tool} failed on {path!r}: {error.detail}"
