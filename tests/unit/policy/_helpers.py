from __future__ import annotations

from pathlib import Path
from typing import Any

from corral_api.kinds import AgentSpec, ToolPolicy
from corral_harness.ports import ToolSpec, TurnContext

OBJ: dict[str, Any] = {"type": "object"}

WORKING = [
    ToolSpec("read", "Read a file.", OBJ),
    ToolSpec("write", "Write a file.", OBJ, writes=True),
    ToolSpec("edit", "Edit a file.", OBJ, writes=True),
    ToolSpec("bash", "Run a shell command.", OBJ, writes=True),
    ToolSpec("grep", "Search file contents.", OBJ),
    ToolSpec("glob", "Find files by pattern.", OBJ),
]


def menu(name: str, description: str = "A control tool.", instructions: str = "") -> ToolSpec:
    return ToolSpec(
        f"mcp__corral__{name}", description, OBJ, kind="menu", instructions=instructions
    )


def agent(allow: list[str] | None = None, deny: list[str] | None = None, **kw: Any) -> AgentSpec:
    return AgentSpec(
        identity="You are a careful engineer.",
        model="claude-sonnet-4-5",
        tools=ToolPolicy(allow=allow if allow is not None else ["*"], deny=deny or []),
        **kw,
    )


def ctx(
    root: Path,
    spec: AgentSpec | None = None,
    *,
    read_only: bool = False,
    conversation: str = "conv-1",
    submission: str = "sub-1",
    window: int = 200_000,
    max_output: int = 8_000,
    model: str = "claude-sonnet-4-5",
) -> TurnContext:
    return TurnContext(
        conversation=conversation,
        submission_id=submission,
        agent=spec or agent(),
        model=model,
        thinking_level="medium",
        granted_root=root,
        read_only=read_only,
        context_window=window,
        max_output_tokens=max_output,
    )
