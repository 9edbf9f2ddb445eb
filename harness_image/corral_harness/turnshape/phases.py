"""A turn's phases and the transitions between them, as data.

The clean path is understand -> choose_route -> plan -> execute -> check -> answer -> done. A
tool call is a step of the phase the turn is in; a phase admits only its own kind of step
(`STEP_KINDS`), so a call that does not belong on the current path is refused before it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Final, Literal


class Phase(StrEnum):
    UNDERSTAND = "understand"
    ASK = "ask"
    CHOOSE_ROUTE = "choose_route"
    INVESTIGATE = "investigate"
    PLAN = "plan"
    EXECUTE = "execute"
    CHECK = "check"
    WAIT_FOR_HUMAN = "wait_for_human"
    ANSWER = "answer"
    DONE = "done"
    STOPPED = "stopped"
    FAILED = "failed"


TERMINAL: Final = frozenset({Phase.DONE, Phase.STOPPED, Phase.FAILED})

_TRANSITIONS: Final[Mapping[Phase, frozenset[Phase]]] = {
    Phase.UNDERSTAND: frozenset({Phase.ASK, Phase.CHOOSE_ROUTE}),
    Phase.ASK: frozenset({Phase.WAIT_FOR_HUMAN}),
    Phase.WAIT_FOR_HUMAN: frozenset({Phase.STOPPED}),
    # direct answers at once; investigate gathers and classifies again; checklist plans first.
    Phase.CHOOSE_ROUTE: frozenset({Phase.ANSWER, Phase.EXECUTE, Phase.INVESTIGATE, Phase.PLAN}),
    Phase.INVESTIGATE: frozenset({Phase.UNDERSTAND}),
    Phase.PLAN: frozenset({Phase.EXECUTE, Phase.WAIT_FOR_HUMAN}),
    Phase.EXECUTE: frozenset({Phase.CHECK}),
    # A send-back or the next checklist step executes again; a miss replans the step.
    Phase.CHECK: frozenset({Phase.EXECUTE, Phase.PLAN, Phase.ANSWER}),
    Phase.ANSWER: frozenset({Phase.DONE}),
}
# Any phase that is not over may stop (an abort) or fail.
TRANSITIONS: Final[Mapping[Phase, frozenset[Phase]]] = {
    phase: _TRANSITIONS.get(phase, frozenset()) | ({Phase.STOPPED, Phase.FAILED} - {phase})
    if phase not in TERMINAL
    else frozenset()
    for phase in Phase
}

StepKind = Literal["read", "work", "plan"]
# What kind of tool call each phase admits; a phase not named admits none.
STEP_KINDS: Final[Mapping[Phase, frozenset[StepKind]]] = {
    Phase.INVESTIGATE: frozenset({"read"}),
    Phase.PLAN: frozenset({"plan"}),
    Phase.EXECUTE: frozenset({"read", "work"}),
}


class OffPath(ValueError):
    """A transition the table does not allow."""


def step_refusal(phase: Phase, kind: StepKind, name: str) -> str | None:
    """None when phase `phase` admits a `kind` call, else the error result the model reads."""
    if kind in STEP_KINDS.get(phase, ()):
        return None
    if phase is Phase.INVESTIGATE and kind == "work":
        return (
            f"This call did not run: {name} changes things, and this is a read-only investigation."
        )
    return f"This call did not run: {name} is not a step of the turn's {phase.value} phase."


class PhaseMachine:
    """The phases one turn passes. `on_end(phase, detail)` is told each phase once, at its end,
    before the next phase begins; `on_enter(phase)` when one begins."""

    def __init__(
        self,
        on_enter: Callable[[Phase], None] | None = None,
        on_end: Callable[[Phase, str], None] | None = None,
    ) -> None:
        self._on_enter = on_enter
        self._on_end = on_end
        self.current = Phase.UNDERSTAND
        self.path: list[Phase] = [Phase.UNDERSTAND]
        if on_enter is not None:
            on_enter(Phase.UNDERSTAND)

    def move(self, to: Phase, detail: str = "") -> None:
        if to not in TRANSITIONS[self.current]:
            raise OffPath(f"{self.current.value} -> {to.value} is not a transition of a turn")
        if self._on_end is not None:
            self._on_end(self.current, detail)
        self.current = to
        self.path.append(to)
        if self._on_enter is not None:
            self._on_enter(to)
        if to in TERMINAL and self._on_end is not None:
            self._on_end(to, "")

    def walk(self, *phases: Phase) -> None:
        for phase in phases:
            self.move(phase)

    @property
    def over(self) -> bool:
        return self.current in TERMINAL

    def names(self) -> list[str]:
        return [p.value for p in self.path]
