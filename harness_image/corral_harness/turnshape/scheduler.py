"""The scheduler's decisions, as pure functions: which route a turn takes, and what the
classifier's structured answer means.

Before choosing, the classifier writes down what it understood and what counts as done. An
unclear understanding asks the human and stops; a clear one names a route. Without a working
classifier (unconfigured, or its answer failed) the turn falls back to the reactive loop, unless
the caller forced decide-then-act: then it stops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from corral_api.turnshape import ROUTES, RouteName

from ..ports import ToolSpec

CLASSIFY_TOOL = "classify"
CLASSIFIER_UNAVAILABLE = "classifier_unavailable"

CLASSIFY_SPEC = ToolSpec(
    name=CLASSIFY_TOOL,
    description="Record what you understood of the task, what counts as done, and the route.",
    input_schema={
        "type": "object",
        "properties": {
            "understood": {"type": "string", "description": "The task, in your words."},
            "done": {"type": "string", "description": "What counts as done."},
            "clear": {"type": "boolean", "description": "False: a person must answer first."},
            "question": {"type": "string", "description": "When not clear: what to ask."},
            "route": {"type": "string", "enum": list(ROUTES)},
        },
        "required": ["understood", "done", "clear"],
    },
    kind="control",
)

CLASSIFIER_SYSTEM = (
    "You are the scheduler of a coding agent. Do not do the task. Call the classify tool once: "
    "write what you understood and what counts as done. If the task cannot be done without a "
    "person's answer, set clear to false and ask one question. Otherwise pick the route: "
    "direct (answer from knowledge, no tools), oneTool (a single tool call), checklist (a "
    "frozen plan of checked steps), reactive (a tool loop), investigate (read-only look "
    "first, then decide)."
)


@dataclass(frozen=True)
class Classification:
    understood: str
    done: str
    clear: bool
    question: str = ""
    route: RouteName | None = None


def parse_classification(data: Any) -> Classification | str:
    """The classifier's tool input as a Classification, or why it cannot be one."""
    if not isinstance(data, dict):
        return "the classifier's answer is not an object"
    understood, done, clear = data.get("understood"), data.get("done"), data.get("clear")
    if not isinstance(understood, str) or not isinstance(done, str) or not isinstance(clear, bool):
        return "the classifier's answer needs understood, done (strings) and clear (boolean)"
    question = data.get("question") or ""
    if not clear:
        if not isinstance(question, str) or not question.strip():
            return "an unclear classification must ask a question"
        return Classification(understood, done, False, question.strip())
    route = data.get("route")
    if route not in ROUTES:
        return f"route must be one of {', '.join(ROUTES)}; got {route!r}"
    return Classification(understood, done, True, route=route)


@dataclass(frozen=True)
class Start:
    """How a turn starts: `classify` (ask the classifier), or `route` with the route it runs,
    or `stop` with the error that ends it."""

    action: Literal["classify", "route", "stop"]
    route: RouteName | None = None
    handler: str = ""
    reason: str = ""


def start(
    *, loop: str, forced_plan: bool, classifier_model: str | None, decide_then_act: bool
) -> Start:
    """The first decision of a turn, before any model call."""
    if forced_plan:
        return Start("route", "checklist", "forced_plan")
    if loop != "auto":
        route: RouteName = loop if loop in ROUTES else "reactive"
        return Start("route", route, route)
    if classifier_model:
        return Start("classify")
    return fallback("no classifier is configured (spec.scheduler.classifierModel)", decide_then_act)


def fallback(why: str, decide_then_act: bool) -> Start:
    """The classifier cannot decide: the reactive loop, or a stop under decide-then-act."""
    if decide_then_act:
        return Start("stop", reason=f"decideThenAct is set and {why}")
    return Start("route", "reactive", "reactive_fallback", reason=why)


def after_classification(
    found: Classification | str, *, decide_then_act: bool, investigated: bool
) -> Start:
    """The route after the classifier answered (`found`: its answer, or why it failed). One
    investigation per turn: asked for a second, the turn goes on in the reactive loop."""
    if isinstance(found, str):
        return fallback(f"the classifier failed: {found}", decide_then_act)
    if not found.clear:
        return Start("stop", reason="ask")
    assert found.route is not None
    if found.route == "investigate" and investigated:
        return Start("route", "reactive", "reactive", reason="investigated once already")
    return Start("route", found.route, found.route)
