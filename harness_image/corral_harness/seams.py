"""The seams between the turn (engine + wire) and the policy that decides what the model sees.

The turn owns running: the queue, the provider stream, executing tools, the transcript. The
policy owns deciding: which tools are shown, whether a call runs, what goes in the window, and
whether a finished turn is accepted. The turn calls the policy through `TurnPolicy`; the policy
never calls back into the turn. Approvals ("ask") go through `ApprovalPort`, which is the
custodian in a pod and a local store on a workstation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from corral_api.kinds import AgentSpec, ThinkingLevel

ToolKind = Literal["working", "menu", "control"]
Outcome = Literal["allow", "deny", "ask"]


@dataclass(frozen=True)
class ToolSpec:
    """One tool in the live catalog."""

    name: str
    description: str  # one line, shown to the model
    input_schema: dict[str, Any]
    kind: ToolKind = "working"
    instructions: str = ""  # longer text, fetched on demand only
    pick: bool = False  # a Menu tool whose call can end the turn
    writes: bool = False  # changes files or runs commands (refused when read-only)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class ToolDecision:
    outcome: Outcome
    reason: str = ""
    input: dict[str, Any] | None = None  # a hook's rewrite of the call's input
    # A pre-tool hook denied and the caller did not opt out: the turn ends after this call.
    abort_turn: bool = False


@dataclass(frozen=True)
class TurnContext:
    """What the policy may know about the call in progress. Read afresh every step."""

    conversation: str
    submission_id: str
    agent: AgentSpec
    model: str
    thinking_level: ThinkingLevel
    granted_root: Path
    read_only: bool
    context_window: int
    max_output_tokens: int
    run_id: str = ""
    memory_scope: str = ""


@dataclass
class ModelRequestPlan:
    """What the provider gets for one generation, or why it must not be called."""

    system: str
    messages: list[dict[str, Any]]
    # Lines added for this call only (recall, hooks); never written to the transcript.
    call_only_lines: list[str] = field(default_factory=list)
    # When set, the provider is not called and the turn stops with this reason.
    stop_reason: str | None = None
    # A compaction summary to write back into the transcript as its own marked entry.
    compaction: dict[str, Any] | None = None
    layer_tokens: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TurnVerdict:
    """After-turn judgement: accept the turn, or send it back with a reason."""

    accept: bool
    reason: str = ""
    # Do not send the turn back again: it stops (send-backs spent, or a denial that aborts).
    stop: bool = False


class TurnPolicy(Protocol):
    def visible_tools(self, ctx: TurnContext, catalog: list[ToolSpec]) -> list[ToolSpec]: ...

    async def decide_tool(self, ctx: TurnContext, call: ToolCall) -> ToolDecision: ...

    async def prepare_request(
        self, ctx: TurnContext, transcript: list[dict[str, Any]]
    ) -> ModelRequestPlan: ...

    async def after_tool(
        self, ctx: TurnContext, call: ToolCall, result: str, is_error: bool
    ) -> None: ...

    async def after_turn(self, ctx: TurnContext, final_text: str) -> TurnVerdict: ...


class ApprovalPort(Protocol):
    async def request(self, ctx: TurnContext, call: ToolCall, reason: str) -> str:
        """Create a pending approval; returns its id."""
        ...

    async def wait(self, approval_id: str) -> Literal["approved", "denied"]:
        """Block until a human decides."""
        ...
