"""The shape of a turn as the API states it: routes, the scheduler's dials, forced plans and the
machine checks a plan step carries (docs/turns.md).

A check is data the harness evaluates against the tool results of the step's own run; nothing
the model writes about its work counts. Fields set on one check must all hold (a combination);
`either` holds when one of its checks does.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ._base import ApiModel, cel, with_rules

# The routes the scheduler can name; `auto` lets the classifier choose one per turn.
RouteName = Literal["direct", "oneTool", "checklist", "reactive", "investigate"]
LoopKind = Literal["auto", "direct", "oneTool", "checklist", "reactive", "investigate", "plan"]
ROUTES: tuple[RouteName, ...] = ("direct", "oneTool", "checklist", "reactive", "investigate")
# `plan` was a loop value before forced plans existed; it is refused with this message.
PLAN_LOOP_MESSAGE = (
    "loop: plan is no longer a loop: a forced plan is Session.spec.plan (docs/turns.md); "
    "use loop: checklist for a frozen checklist the model plans itself"
)
MAX_PLAN_STEPS = 20
StepVerdict = Literal["Pending", "Held", "Missed", "Struck"]
PlanState = Literal["Gated", "Open", "Done", "Struck"]


_ANY_CHECK = (
    "has(self.token) || has(self.contains) || has(self.absent) || has(self.exitCode)"
    " || has(self.json) || has(self.evidence)"
)
CHECK_MESSAGE = (
    "a check needs at least one test: token, contains, absent, exitCode, json, evidence or either"
)


class JsonCheck(ApiModel):
    """The last tool result of the step, parsed as JSON, has `path` (dots; list indexes as
    numbers); with `equals`, the value there is that string, or that JSON text."""

    path: str = Field(min_length=1, max_length=512, description="Dot path, e.g. `a.items.0`.")
    equals: str | None = Field(
        default=None, max_length=4096, description="The value: a string, or JSON text."
    )


class LeafCheck(ApiModel):
    """One or more tests against the step's tool results; every one that is set must hold."""

    token: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        pattern=r"^\S+$",
        description="A tool result holds this exact whitespace-separated word.",
    )
    contains: str | None = Field(
        default=None, min_length=1, max_length=4096, description="A tool result contains this."
    )
    absent: str | None = Field(
        default=None, min_length=1, max_length=4096, description="No tool result contains this."
    )
    exit_code: int | None = Field(
        default=None, ge=0, le=255, description="The step's last command exited with this code."
    )
    json_check: JsonCheck | None = Field(
        default=None, alias="json", description="The last tool result as JSON."
    )
    evidence: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="A command the runtime runs after the step (never the model); holds when "
        "it exits 0.",
    )

    def tests(self) -> list[str]:
        """The names of the tests this check sets."""
        names = ("token", "contains", "absent", "exit_code", "json_check", "evidence")
        return [n for n in names if getattr(self, n) is not None]

    @model_validator(mode="after")
    def _has_a_test(self) -> LeafCheck:
        if not self.tests() and not getattr(self, "either", None):
            raise ValueError(CHECK_MESSAGE)
        return self

    model_config = with_rules(cel(_ANY_CHECK, "a check needs at least one test"))


class StepCheck(LeafCheck):
    """A step's machine check: its own tests, all of which must hold, and `either`."""

    either: list[LeafCheck] = Field(
        default_factory=list,
        max_length=8,
        description="Holds when one of these holds (and every test set above holds too).",
    )

    model_config = with_rules(
        cel(f"{_ANY_CHECK} || (has(self.either) && size(self.either) > 0)", CHECK_MESSAGE)
    )


class PlanStep(ApiModel):
    action: str = Field(min_length=1, max_length=512, description="What the step does.")
    check: StepCheck = Field(description="The machine check against the step's tool results.")


class ForcedPlan(ApiModel):
    """A plan the caller forces on the turn: the checklist is opened (its first steps may be
    given), or, with `gate`, a person approves it before any step runs."""

    gate: bool = Field(
        default=False,
        description="Stop after planning; the plan runs once a person replies (corral reply).",
    )
    steps: list[PlanStep] = Field(
        default_factory=list,
        max_length=MAX_PLAN_STEPS,
        description="The plan's first steps; empty: the model plans them through its plan tools.",
    )


class SchedulerSpec(ApiModel):
    """The classifier that picks a route when `loop` is `auto`."""

    classifier_model: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="The classifier's (small) model; unset: no classifier, the reactive loop "
        "runs (unless the Session sets decideThenAct).",
    )
    classifier_max_tokens: int = Field(
        default=1024, ge=64, le=8192, description="The classifier's output budget per call."
    )


class PlanStepStatus(ApiModel):
    action: str = Field(description="The step as the plan holds it now.")
    verdict: StepVerdict = Field(description="Pending, Held, Missed (replanned) or Struck.")
    attempts: int = Field(default=0, ge=0, description="Times the step ran.")
    detail: str = Field(default="", description="What the check saw.")


class PlanStatus(ApiModel):
    state: PlanState = Field(description="Gated, Open, Done or Struck.")
    steps: list[PlanStepStatus] = Field(default_factory=list, description="Each step's verdict.")


def loop_rule() -> object:
    """The CEL rule that refuses the retired `plan` loop."""
    return cel("!has(self.loop) || self.loop != 'plan'", PLAN_LOOP_MESSAGE, field_path=".loop")
