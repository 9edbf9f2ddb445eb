"""The ports between the turn (engine + wire) and the policy that decides what the model sees.

The turn owns running: the queue, the provider stream, executing tools, the transcript. The
policy owns deciding: which tools are shown, whether a call runs, what goes in the window, and
whether a finished turn is accepted. The turn calls the policy through `TurnPolicy`; the policy
never calls back into the turn. Approvals ("ask") go through `ApprovalPort`, which is the
custodian in a pod and a local store on a workstation. Everything the harness does to the
workspace (files, commands, path checks, instruction files) goes through `Workspace`: in-process
on a workstation, the tools container's exec service in a pod.
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from corral_api.kinds import AgentSpec, ThinkingLevel

from .paths import PathVerdict

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
    stop_error: str = "context_overflow"  # the settlement's error type when stopped
    # A compaction summary to write back into the transcript as its own marked entry.
    compaction: dict[str, Any] | None = None
    layer_tokens: dict[str, int] = field(default_factory=dict)
    # The leading parts of `system` (joined by blank lines) that stay the same call after call
    # (the identity, the instruction files): the request marks each for the prompt cache.
    stable_system: tuple[str, ...] = ()


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


# ------------------------------------------------------------------------------- the workspace

PathKind = Literal["file", "dir", "other", "missing"]
WorkspaceErrorKind = Literal[
    "outside",  # the path resolves outside the granted root
    "uncertain",  # it cannot be resolved with certainty (NUL, not UTF-8, a dangling symlink)
    "missing",
    "not_file",
    "not_dir",
    "is_dir",
    "not_text",  # not valid UTF-8
    "too_large",
    "no_program",
    "bad_request",
    "bad_pattern",
    "io",  # any other operating-system failure; the detail is the errno's text
    "unavailable",  # the exec service could not be reached
]


class WorkspaceError(Exception):
    """A workspace operation that did not happen; the tools word it for the model."""

    def __init__(self, kind: WorkspaceErrorKind, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind: WorkspaceErrorKind = kind
        self.detail = detail


@dataclass(frozen=True)
class ResolvedPath:
    verdict: PathVerdict
    path: str  # relative to the root ("." for the root itself); "" unless inside
    kind: PathKind


@dataclass(frozen=True)
class LineWindow:
    lines: list[str]
    more: bool  # lines follow the window
    clipped: bool  # the window stopped at its byte cap (its last line may be cut)


@dataclass(frozen=True)
class GlobMatches:
    matches: list[str]  # relative to the root, sorted by their components
    more: bool  # there were more than the limit


@dataclass(frozen=True)
class FoundFile:
    path: str  # relative to the root
    size: int
    mtime_ns: int
    content: str | None  # None: unchanged since the fingerprint the caller gave


@dataclass(frozen=True)
class DirEntry:
    name: str
    kind: PathKind  # a symlink is "other": it is not followed


@dataclass(frozen=True)
class Survey:
    """What the context needs of the tree before a model call, read in one go."""

    files: list[FoundFile]  # `find`'s answer
    entries: list[DirEntry]  # the root's
    git_head: str | None  # the text of .git/HEAD, when the root holds one
    # The change signal: moves whenever any of the above differs from the last survey's (or a
    # file is too recently changed to trust its fingerprint). `unchanged`: the caller's `since`
    # is still current, and files, entries and git_head are left empty.
    generation: int = 0
    unchanged: bool = False


@dataclass(frozen=True)
class CommandOutcome:
    exit_code: int  # -N when killed by signal N; -9 on timeout
    output: str  # stdout and stderr merged, head and tail kept with a marker between
    timed_out: bool


@dataclass(frozen=True)
class Programs:
    """The programs the tools run, as found where the commands run."""

    shell: str
    ripgrep: str | None


Fingerprint = tuple[int, int]  # (size, mtime_ns)


class PathClassifier(Protocol):
    async def classify(self, path: str) -> PathVerdict: ...


class Workspace(PathClassifier, Protocol):
    """The granted root and what may be done in it. Paths are relative to the root or absolute;
    every operation checks its path itself (symlinks and `..` resolved) and raises
    `WorkspaceError` instead of acting outside the root."""

    @property
    def root(self) -> Path:
        """The granted root's real path, where the commands run."""
        ...

    async def resolve(self, path: str) -> ResolvedPath: ...

    async def read_lines(self, path: str, offset: int, limit: int, max_bytes: int) -> LineWindow:
        """Lines offset.. (1-based) of a file; lines end at "\n", a trailing "\r" dropped."""
        ...

    async def read_text(self, path: str, max_bytes: int) -> str:
        """A whole file that must be valid UTF-8 (edit's input)."""
        ...

    async def write_text(self, path: str, content: str) -> str:
        """Create or replace a file (and its parents); returns its path relative to the root."""
        ...

    async def glob(self, path: str, pattern: str, limit: int) -> GlobMatches: ...

    async def find(
        self, name: str, known: Mapping[str, Fingerprint], max_bytes: int
    ) -> list[FoundFile]:
        """Every regular file called `name` under the root (.git and symlinked directories
        skipped); a file whose fingerprint is in `known` and holds comes without content."""
        ...

    async def list_dir(self, path: str) -> list[DirEntry]: ...

    async def survey(
        self, name: str, known: Mapping[str, Fingerprint], max_bytes: int, since: int = 0
    ) -> Survey:
        """`find`, the root's entries and .git/HEAD, in one round trip to the exec service;
        only `unchanged` when `since` is still the generation."""
        ...

    def survey_generation(self, name: str) -> int | None:
        """The survey generation of `name` as the last command left the tree (the workspace
        scans once a command has exited); None before any survey of that name."""
        ...

    async def run(
        self, argv: Sequence[str], *, timeout: float, keep_bytes: int, cwd: str = "."
    ) -> CommandOutcome:
        """Run argv in its own process group; the group is killed on timeout or cancellation."""
        ...

    async def programs(self) -> Programs: ...


def workspace_text(data: bytes) -> str:
    """Bytes from the workspace as text: every byte that is not part of valid UTF-8 becomes
    U+FFFD on its own (what the exec service's JSON encoding does, so both backends agree)."""
    return data.decode("utf-8", errors="corral-bytewise")


def _bytewise(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    return "\ufffd" * (exc.end - exc.start), exc.end


codecs.register_error("corral-bytewise", _bytewise)
