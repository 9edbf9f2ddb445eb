"""The engine seam: the interface between the turn and whatever runs the model's tool loop.

The turn gives an engine one submission's run (`EngineJob`: model, thinking level, system
prompt, tools, context, prompt). It hears the run as `EngineEvent`s, can `steer` it (a user
message before the next request) and `abort` it, and decides inside it through `EngineHooks`:

- `convert_messages`: the messages the provider gets, derived from the engine's working messages
  (the list the engine appends its answers and tool results to; it is never replaced).
- `before_request`: the request plan for the next generation (system prompt, messages), or a
  `StopRun` when the provider must not be called.
- `before_tool_call`: allow a call, block it with a reason, or block it and abort the run.
- `ends_run`: whether the run ends at this step boundary.

Rules every engine keeps (they are part of the seam, not of one adapter):

- The tool calls of one model answer run one at a time, in the order written; a call's
  `before_tool_call` comes after the previous call's result is complete.
- `message_end` of a model answer comes before any hook or event about its calls.
- `tool_start` is sent for every call, in order, before the tool or arguments are checked.
- `before_tool_call` is asked only about a call of a tool the run has, with valid arguments;
  other calls get the engine's own error result.
- After an abort, calls that did not start get no result from the engine; the outcome lists
  them (`unanswered`) and the turn writes the "did not run" answer for each. A failed stream's
  whole calls are listed the same way, after a `message_end` of what it had streamed.
- A call whose input was cut off (the answer stopped before its block did, or its JSON is not
  an object) never runs: it gets the engine's error result, and its streamed input is kept.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from corral_api.kinds import ThinkingLevel
from corral_common.catalog import ModelInfo

from ..ports import ToolCall, ToolSpec
from ..tools import ToolResult

DID_NOT_RUN = "This call did not run: your turn ended before it started."


@dataclass(frozen=True)
class EngineTool:
    """A tool as the run has it: its spec (named as the model sees it) and how to run it."""

    spec: ToolSpec
    execute: Callable[[dict[str, Any]], Awaitable[ToolResult]]


@dataclass
class EngineJob:
    conversation: str
    model: ModelInfo
    thinking_level: ThinkingLevel
    system: str
    tools: list[EngineTool]
    context: list[dict[str, Any]]  # the conversation so far, provider message shape
    # Appended to the context as a user message; None: the context already holds the turn's
    # messages (a run on the conversation's transcript, ADR 0100).
    prompt: str | None
    max_output_tokens: int
    run_id: str = ""  # sent to the model endpoint (the custodian) as X-Corral-Run-Id


@dataclass(frozen=True)
class Usage:
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    @property
    def tokens(self) -> int:
        """What the runaway watch and the ledger count, as the budget does: input, output and
        cache writes (prompt input the cache took in); cache reads are not counted."""
        return self.input + self.output + self.cache_write


@dataclass(frozen=True)
class MessageEnd:
    message: dict[str, Any]  # {role: assistant, content: [...]}
    stop_reason: str  # the provider's; "aborted" or "error" for what a cut or failed stream kept
    usage: Usage | None  # None when the stream was cut before the provider reported usage
    type: Literal["message_end"] = "message_end"


@dataclass(frozen=True)
class ToolStart:
    call: ToolCall
    type: Literal["tool_start"] = "tool_start"


@dataclass(frozen=True)
class ToolEnd:
    call: ToolCall
    result: ToolResult
    type: Literal["tool_end"] = "tool_end"


@dataclass(frozen=True)
class StepBoundary:
    step: int
    type: Literal["step_boundary"] = "step_boundary"


EngineEvent = MessageEnd | ToolStart | ToolEnd | StepBoundary


@dataclass(frozen=True)
class RequestPlan:
    system: str
    messages: list[dict[str, Any]]
    # The leading parts of `system` (joined by blank lines) that stay the same call after call:
    # each ends a prefix the request marks for the provider's prompt cache (`caching.py`).
    stable_system: tuple[str, ...] = ()


class StopRun(Exception):
    """Raised by `before_request` when the provider must not be called (e.g. over budget)."""

    def __init__(self, reason: str, error_type: str = "context_overflow") -> None:
        super().__init__(reason)
        self.reason = reason
        self.error_type = error_type


@dataclass(frozen=True)
class ToolGate:
    """`before_tool_call`'s answer. `block` is the error result the model gets instead."""

    block: str | None = None
    abort: bool = False
    input: dict[str, Any] | None = None  # a rewrite of the call's input


ALLOW = ToolGate()


class EngineHooks(Protocol):
    async def convert_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The request's messages, derived from the engine's own list (ADR 0100)."""
        ...

    async def before_request(self, messages: list[dict[str, Any]]) -> RequestPlan: ...

    async def before_tool_call(self, call: ToolCall) -> ToolGate: ...

    def ends_run(self, step: int) -> bool: ...


@dataclass
class EngineError:
    type: str
    message: str


@dataclass
class EngineOutcome:
    status: Literal["completed", "aborted", "failed", "ended_by_hook"]
    error: EngineError | None = None
    unanswered: list[ToolCall] = field(default_factory=list)
    steps: int = 0


Listener = Callable[[EngineEvent], Awaitable[None]]


class Engine(Protocol):
    """One run of one submission. Made fresh per submission by an `EngineAdapter`."""

    async def run(
        self, job: EngineJob, hooks: EngineHooks, listener: Listener
    ) -> EngineOutcome: ...

    def steer(self, text: str) -> None: ...

    def abort(self) -> None: ...


EngineAdapter = Callable[[], Engine]
