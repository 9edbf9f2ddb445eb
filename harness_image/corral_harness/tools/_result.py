from __future__ import annotations

from dataclasses import dataclass


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
