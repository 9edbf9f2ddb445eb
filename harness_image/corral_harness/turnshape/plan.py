"""The plan a turn follows: its steps, their checks and verdicts, and the plan tools.

The model opens a plan and edits its steps only through the plan tools; the runtime writes the
plan's body (`render`). A miss replans that step once; a second miss strikes the unfinished tail
and keeps the steps that held.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from corral_api.turnshape import MAX_PLAN_STEPS, PlanState, PlanStep, StepCheck, StepVerdict

from ..ports import ToolSpec

PLAN_OPEN = "plan_open"
PLAN_EDIT = "plan_edit_step"
PLAN_TOOLS = frozenset({PLAN_OPEN, PLAN_EDIT})

_CHECK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Machine check on the step's tool results: token, contains, absent, "
    "exitCode, json {path, equals}, evidence (a command the runtime runs), either [checks].",
}
_STEP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"action": {"type": "string"}, "check": _CHECK_SCHEMA},
    "required": ["action", "check"],
}
PLAN_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name=PLAN_OPEN,
        description="Open the plan: its steps in order, each with a machine check.",
        input_schema={
            "type": "object",
            "properties": {"steps": {"type": "array", "items": _STEP_SCHEMA}},
            "required": ["steps"],
        },
        kind="control",
    ),
    ToolSpec(
        name=PLAN_EDIT,
        description="Replace one unfinished step of the open plan (numbered from 1).",
        input_schema={
            "type": "object",
            "properties": {"step": {"type": "integer"}, **_STEP_SCHEMA["properties"]},
            "required": ["step", "action", "check"],
        },
        kind="control",
    ),
)

Next = Literal["next", "replan", "strike"]


@dataclass
class StepState:
    action: str
    check: StepCheck
    verdict: StepVerdict = "Pending"
    attempts: int = 0
    detail: str = ""


@dataclass
class PlanBook:
    """One conversation's plan."""

    steps: list[StepState] = field(default_factory=list)
    gated: bool = False  # waiting for a person before any step runs
    struck: bool = False

    @property
    def opened(self) -> bool:
        return bool(self.steps)

    @property
    def state(self) -> PlanState:
        if self.struck:
            return "Struck"
        if self.gated:
            return "Gated"
        return "Done" if self.steps and self.current() is None else "Open"

    def current(self) -> int | None:
        """The first step that has not held yet (None: every step held)."""
        for index, step in enumerate(self.steps):
            if step.verdict in ("Pending", "Missed"):
                return index
        return None

    def open(self, steps: list[PlanStep]) -> None:
        self.steps = [StepState(s.action, s.check) for s in steps]

    # ------------------------------------------------------------------ the plan tools

    def call(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        """Run a plan tool; (result text, is_error)."""
        try:
            if name == PLAN_OPEN:
                if self.opened:
                    return "A plan is already open: edit its steps with plan_edit_step.", True
                steps = _steps(args.get("steps"))
                self.open(steps)
                return "Plan opened.\n" + self.render(), False
            index = args.get("step")
            if not isinstance(index, int) or not 1 <= index <= len(self.steps):
                return f"step must be a number from 1 to {len(self.steps)}", True
            held = self.steps[index - 1]
            if held.verdict in ("Held", "Struck"):
                return f"step {index} is {held.verdict.lower()}: it cannot change", True
            (step,) = _steps([{"action": args.get("action"), "check": args.get("check")}])
            held.action, held.check = step.action, step.check
            return f"Step {index} edited.\n" + self.render(), False
        except ValueError as exc:
            return f"The plan was not changed: {exc}", True

    # ------------------------------------------------------------------ verdicts

    def record(self, index: int, held: bool, detail: str) -> Next:
        step = self.steps[index]
        step.attempts += 1
        step.detail = detail
        if held:
            step.verdict = "Held"
            return "next"
        if step.verdict == "Pending":
            step.verdict = "Missed"
            return "replan"
        for tail in self.steps[index:]:
            if tail.verdict != "Held":
                tail.verdict = "Struck"
        self.struck = True
        return "strike"

    # ------------------------------------------------------------------ the body

    def render(self) -> str:
        lines = []
        for number, step in enumerate(self.steps, 1):
            check = json.dumps(step.check.model_dump(by_alias=True, exclude_defaults=True))
            lines.append(f"{number}. [{step.verdict}] {step.action} (check: {check})")
        return "\n".join(lines)

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "steps": [
                {
                    "action": s.action,
                    "verdict": s.verdict,
                    "attempts": s.attempts,
                    "detail": s.detail[:500],
                }
                for s in self.steps
            ],
        }


def _steps(raw: Any) -> list[PlanStep]:
    if not isinstance(raw, list) or not raw:
        raise ValueError("steps must be a non-empty list of {action, check}")
    if len(raw) > MAX_PLAN_STEPS:
        raise ValueError(f"at most {MAX_PLAN_STEPS} steps")
    try:
        return [PlanStep.model_validate(item) for item in raw]
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise ValueError(problems) from None
