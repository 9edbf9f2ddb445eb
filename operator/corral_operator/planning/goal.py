"""The Goal planner: waves of Sessions until the success check passes or the waves run out.

Pure: the Goal, the Sessions it started and the namespace's Evidence for its check in; the
status, what to create and the Events out. Everything it decides is derived from what it is
given, so a restarted operator (or a second pass over the same objects) plans the same thing:

- no wave yet: start wave 1, a Session from `spec.sessionTemplate`;
- the current wave's Session still runs: wait;
- it ended and `status.delivery.revision` names what it pushed: run the success check there as
  Evidence (one per check definition, revision and repository; an existing one is reused);
- the Evidence says Pass: the Goal is Met; Fail or Error (or nothing was pushed to check): the
  next wave starts, its task carrying the last answer and verdict, until `maxWaves`, then Failed.

docs/goals.md describes the whole cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Named here too: the handler and the tests import them from this module.
from ._goal_checks import ACCEPTED as ACCEPTED
from ._goal_checks import CHECKING_WAVE as CHECKING_WAVE
from ._goal_checks import DELIVERY_GRACE_SECONDS as DELIVERY_GRACE_SECONDS
from ._goal_checks import GOAL_CHECKS as GOAL_CHECKS
from ._goal_checks import GOAL_MET as GOAL_MET
from ._goal_checks import GOAL_RECHECK as GOAL_RECHECK
from ._goal_checks import INVALID_SPEC as INVALID_SPEC
from ._goal_checks import WAVE_RUNNING as WAVE_RUNNING
from ._goal_checks import WAVES_EXHAUSTED as WAVES_EXHAUSTED
from ._goal_checks import GoalDecision, GoalInputs, decide_goal
from ._goal_waves import GOAL_ANNOTATION as GOAL_ANNOTATION
from ._goal_waves import WAVE_ANNOTATION as WAVE_ANNOTATION
from ._goal_waves import success_check as success_check
from ._goal_waves import wave_session as wave_session
from ._goal_waves import wave_session_name as wave_session_name
from ._goal_waves import wave_task as wave_task
from .session import PlannedEvent


@dataclass(frozen=True)
class GoalPlan:
    status: dict[str, Any]
    changed: bool
    # Objects to create (a wave's Session, a wave's Evidence); one that exists already is fine.
    create: list[dict[str, Any]] = field(default_factory=list)
    events: list[PlannedEvent] = field(default_factory=list)
    # None: the Goal is settled (Met, Failed, or an invalid spec); nothing to come back for.
    requeue_after: float | None = GOAL_RECHECK


def plan_goal(
    body: dict[str, Any],
    sessions: list[dict[str, Any]],
    evidences: list[dict[str, Any]],
    now: datetime,
) -> GoalPlan:
    """Decide the Goal's status and what to create next.

    `sessions` are the Sessions labelled with this Goal (only those it owns count); `evidences`
    the namespace's Evidence for its success check (any that speaks about exactly the check's
    definition, the revision and the repository counts, whoever asked for it).

    The checks of `GOAL_CHECKS` decide in turn (planning/_goal_checks.py); the first decision
    wins, and a wave that ended short of the goal with waves left is followed by the next.
    """
    inputs = GoalInputs(body, sessions, evidences, now)
    return _plan_of(inputs, decide_goal(inputs))


def _plan_of(inputs: GoalInputs, decision: GoalDecision) -> GoalPlan:
    """The plan of a decision: its status with the generation seen."""
    status = decision.status.model_copy(update={"observed_generation": inputs.generation})
    new = status.wire()
    changed = new != inputs.old.wire()
    create, events = list(decision.create), list(decision.events)
    return GoalPlan(new, changed, create, events, decision.requeue_after)
