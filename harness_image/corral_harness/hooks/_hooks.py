from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

log = logging.getLogger(__name__)


class Phase(StrEnum):
    SESSION_START = "session_start"
    BEFORE_TURN = "before_turn"
    BEFORE_GENERATION = "before_generation"
    AFTER_GENERATION = "after_generation"
    BEFORE_TOOL = "before_tool"
    AFTER_TOOL = "after_tool"
    AFTER_TURN = "after_turn"
    SESSION_END = "session_end"


# A deny in these phases aborts the turn unless the caller says otherwise.
PRE_PHASES = frozenset({Phase.BEFORE_TURN, Phase.BEFORE_GENERATION, Phase.BEFORE_TOOL})


@dataclass(frozen=True)
class HookEvent:
    """What a handler sees. Fields not relevant to the phase stay empty."""

    phase: Phase
    conversation: str = ""
    submission_id: str = ""
    system: str = ""
    messages: tuple[dict[str, Any], ...] = ()
    tool_name: str = ""
    tool_input: Mapping[str, Any] = field(default_factory=dict)
    tool_result: str = ""
    tool_is_error: bool = False
    final_text: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HookResult:
    denied: bool = False
    reason: str = ""
    lines: tuple[str, ...] = ()
    system: str | None = None
    tool_input: dict[str, Any] | None = None
    # Whether a denial lets the turn go on (a spec hook's `continue`, docs/hooks.md): True
    # blocks only what was denied; False ends the turn; None keeps the phase's default (ADR 0023).
    proceed: bool | None = None


def allow() -> HookResult:
    return HookResult()


def deny(reason: str) -> HookResult:
    return HookResult(denied=True, reason=reason)


def add_lines(*lines: str) -> HookResult:
    return HookResult(lines=tuple(lines))


def replace_system(system: str) -> HookResult:
    return HookResult(system=system)


def rewrite_input(tool_input: dict[str, Any]) -> HookResult:
    return HookResult(tool_input=dict(tool_input))


HookHandler = Callable[[HookEvent], HookResult | Awaitable[HookResult | None] | None]


@dataclass(frozen=True)
class HookOutcome:
    denied: bool = False
    reason: str = ""
    denied_by: str = ""
    lines: tuple[str, ...] = ()
    system: str | None = None  # replacement for this one call; None keeps the assembled one
    tool_input: dict[str, Any] | None = None  # the last rewrite, None when untouched
    ran: int = 0
    proceed: bool | None = None  # the denying handler's `proceed`


def _handler_name(handler: HookHandler) -> str:
    return getattr(handler, "__qualname__", None) or repr(handler)


@dataclass(frozen=True)
class Hooks:
    handlers: Mapping[Phase, tuple[HookHandler, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def with_handler(self, phase: Phase | str, handler: HookHandler) -> Hooks:
        key = Phase(phase)
        merged = dict(self.handlers)
        merged[key] = (*merged.get(key, ()), handler)
        return Hooks(MappingProxyType(merged))

    def for_phase(self, phase: Phase) -> tuple[HookHandler, ...]:
        return self.handlers.get(phase, ())

    async def run(self, event: HookEvent) -> HookOutcome:
        """Run the phase's handlers in registration order; a deny stops the chain.

        A handler that raises counts as a deny naming the error: a broken guard must not pass
        a call silently. (Fail-open hooks such as memory recall catch their own errors.)
        """
        lines: list[str] = []
        system: str | None = None
        tool_input: dict[str, Any] | None = None
        ran = 0
        for handler in self.for_phase(event.phase):
            ran += 1
            try:
                result = handler(event)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                log.exception("hook %s failed in %s", _handler_name(handler), event.phase)
                return HookOutcome(
                    denied=True,
                    reason=f"hook {_handler_name(handler)} failed: {exc}",
                    denied_by=_handler_name(handler),
                    lines=tuple(lines),
                    ran=ran,
                )
            if result is None:
                continue
            if not isinstance(result, HookResult):
                raise TypeError(
                    f"hook {_handler_name(handler)} returned {type(result).__name__}, "
                    "expected HookResult or None"
                )
            if result.denied:
                return HookOutcome(
                    denied=True,
                    reason=result.reason or "denied by a hook",
                    denied_by=_handler_name(handler),
                    lines=(*lines, *result.lines),
                    proceed=result.proceed,
                    system=system,
                    tool_input=tool_input,
                    ran=ran,
                )
            lines.extend(result.lines)
            if result.system is not None:
                system = result.system
                event = dataclasses.replace(event, system=system)
            if result.tool_input is not None:
                tool_input = result.tool_input
                event = dataclasses.replace(event, tool_input=MappingProxyType(tool_input))
        return HookOutcome(lines=tuple(lines), system=system, tool_input=tool_input, ran=ran)
