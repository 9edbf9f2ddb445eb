"""The Session planner: from the Session, its Agent and its pod, decide what to do next.

The turn driver owns the turn fields of the status (phase while running, turns, ledger,
settlements, usage); this planner owns the sandbox's lifecycle and the conditions, and it
settles the phase only where the driver cannot: before the first turn and when the sandbox
is lost or the spec cannot work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from corral_api.freeze import FrozenBy
from corral_api.kinds import FINAL_PHASES, SessionStatus, SuspendMode

from ..settings import OperatorSettings
from . import reasons as R

# Named here too: the handlers, the loop and the other planners import them from this module.
from ._session_checks import FROZEN_RECHECK as FROZEN_RECHECK
from ._session_checks import SESSION_CHECKS as SESSION_CHECKS
from ._session_checks import STARTING_MESSAGE as STARTING_MESSAGE
from ._session_checks import STARTING_RECHECK as STARTING_RECHECK
from ._session_checks import WAIT_RECHECK as WAIT_RECHECK
from ._session_checks import EventType as EventType
from ._session_checks import PlannedEvent as PlannedEvent
from ._session_checks import SandboxState as SandboxState
from ._session_checks import SessionDecision, decide_session
from ._session_inputs import Ownership as Ownership
from ._session_inputs import SessionInputs
from ._session_inputs import now_text as now_text
from ._session_inputs import ownership as ownership
from ._session_inputs import parse_time as parse_time
from ._session_inputs import pod_is_ready as pod_is_ready
from ._session_inputs import summarize_children as summarize_children
from ._session_inputs import wake_wait as wake_wait
from .conditions import get_condition, remove_condition, set_condition
from .freeze import with_frozen_condition
from .lineage import Lineage


@dataclass(frozen=True)
class SessionPlan:
    status: dict[str, Any]
    status_changed: bool
    create_sandbox: bool = False
    delete_pod: bool = False
    discard_pod: bool = False  # a dead pod, deleted without archiving from it
    delete_session: bool = False
    # Harness serving: the driver may run its turns against this URL.
    harness_url: str | None = None
    # Come back after this many seconds even if nothing changes (TTL, a missing Agent).
    requeue_after: float | None = None
    events: list[PlannedEvent] = field(default_factory=list)
    # What the parent chain allows (turns, budget); set whenever the Session may proceed.
    lineage: Lineage | None = None
    # The sandbox pod's IP once it serves (the custodian's usage record is there too).
    pod_ip: str | None = None
    # Driving only to stop: a Freeze holds the Session while its turn is in flight, so the
    # loop re-attaches and interrupts it (abort, cause `freeze`) at once.
    frozen_by: FrozenBy | None = None
    # Driving only to end the turn in flight as spec.suspendMode says (the Session suspends).
    suspend: SuspendMode | None = None
    # Release the pod of a suspended Session, its conversation's log archived first.
    suspend_pod: bool = False

    @property
    def drive(self) -> bool:
        return self.harness_url is not None


def is_budget_error(error: str | None) -> bool:
    """A settlement's error that says the custodian refused the model call for the budget."""
    return error is not None and "budget_exceeded" in error


def _final_reason(status: SessionStatus) -> str:
    if status.phase == "Succeeded":
        return R.EVALUATION_PASSED if status.evaluation_turns else R.COMPLETED
    if status.phase == "Stopped":
        return R.STOPPED
    last = status.last_settlement
    if last is not None and last.status == "failed" and is_budget_error(last.error):
        return R.BUDGET_EXCEEDED
    if last is not None and last.status == "failed" and (last.error or "").startswith("runaway:"):
        return R.TURN_RUNAWAY
    if last is not None and last.status == "failed":
        return R.TURN_FAILED
    if last is not None and last.status == "aborted":
        return R.TURN_ABORTED
    if status.evaluation_turns:
        return R.EVALUATION_FAILED
    return R.FAILED


def session_conditions(
    status: SessionStatus,
    sandbox: SandboxState,
    *,
    now: str,
    generation: int,
    reason: str | None = None,
) -> SessionStatus:
    """`status` with Ready, Progressing and Succeeded/Failed set from its phase and sandbox.

    `reason` names why the planner itself ended or held the session; otherwise the reason is
    derived from the phase and the last settlement.
    """
    conds = status.conditions
    message = status.message or ""

    def put(type_: str, value: Literal["True", "False"], why: str, text: str) -> None:
        nonlocal conds
        conds = set_condition(conds, type_, value, why, text, now=now, generation=generation)

    ready_reason = {
        "absent": ("False", R.SANDBOX_PENDING, "the sandbox pod is not created yet"),
        "starting": ("False", R.SANDBOX_STARTING, "waiting for the harness to be ready"),
        "ready": ("True", R.SANDBOX_READY, "the harness is serving"),
        "released": ("False", R.SANDBOX_RELEASED, "the sandbox pod was removed"),
        "kept": ("True", R.SANDBOX_KEPT, "the sandbox pod is kept (keepSandbox)"),
    }[sandbox]
    put("Ready", ready_reason[0], ready_reason[1], ready_reason[2])  # type: ignore[arg-type]
    if status.phase == "Suspended":
        put("Progressing", "False", reason or R.SUSPENDED, message)
        conds = remove_condition(remove_condition(conds, "Succeeded"), "Failed")
    elif status.phase in FINAL_PHASES:
        # Why a session ended is said once: a later pass keeps the reason it ended with.
        # (Succeeded is removed while a session runs, so finding it means it had ended.)
        ended = get_condition(conds, "Succeeded")
        why = reason or (ended.reason if ended is not None else None) or _final_reason(status)
        put("Progressing", "False", why, message)
        put("Succeeded", "True" if status.phase == "Succeeded" else "False", why, message)
        if status.phase == "Failed":
            put("Failed", "True", why, message)
        else:
            conds = remove_condition(conds, "Failed")
    else:
        if status.ledger is not None and status.phase == "WaitingForHuman":
            # The turn is held at one call until a person decides its Approval.
            why = reason or status.phase
            text = (message if reason else None) or (
                f"turn {status.ledger.turn} waits for a person to decide its Approval "
                "(`corral get approvals --pending`)"
            )
        elif status.ledger is not None:
            why = reason or f"Turn{status.ledger.turn}InFlight"
            text = message or f"turn {status.ledger.turn} is running"
        else:
            why = reason or status.phase
            text = message
        put("Progressing", "True", why, text)
        conds = remove_condition(remove_condition(conds, "Succeeded"), "Failed")
    return status.model_copy(update={"conditions": conds})


def plan_session(
    body: dict[str, Any],
    agent_body: dict[str, Any] | None,
    pod: dict[str, Any] | None,
    settings: OperatorSettings,
    now: datetime,
    children: list[dict[str, Any]] | None = None,
    approvals: list[dict[str, Any]] | None = None,
    *,
    parents: list[dict[str, Any]] | None = None,
    ancestor_agents: dict[str, dict[str, Any] | None] | None = None,
    existing: dict[str, dict[str, Any]] | None = None,
    frozen_by: FrozenBy | None = None,
) -> SessionPlan:
    """Decide the next actions and the status for one Session.

    `children` are the Sessions this one started (labelled with its uid); `approvals` are the
    namespace's Approvals, read only while the Session waits for a human. `parents` are the
    Sessions met walking `spec.parentRef` up, nearest first, and `ancestor_agents` the Agents
    they name (None: not found). `existing` holds the sandbox's Secret and NetworkPolicy by kind
    when objects with their names exist (looked up while the pod is absent). `frozen_by` is
    the Freeze that holds the Session (`corral_api.freeze.covering_freeze`): nothing is created
    or admitted while it holds, and a turn in flight is driven only to be interrupted.

    The checks of `SESSION_CHECKS` decide in turn (planning/_session_checks.py); the first
    decision wins, and a Session none of them holds is driven at its serving harness.
    """
    inputs = SessionInputs(
        body,
        agent_body,
        pod,
        settings,
        now,
        children,
        approvals,
        parents=parents,
        ancestor_agents=ancestor_agents,
        existing=existing,
        frozen_by=frozen_by,
    )
    return _plan_of(inputs, decide_session(inputs))


def _plan_of(inputs: SessionInputs, decision: SessionDecision) -> SessionPlan:
    """The plan of a decision: its status with the conditions, the Frozen condition and the
    generation seen, and an Event when the phase changed."""
    stamp, generation, old = inputs.stamp, inputs.generation, inputs.old
    status = session_conditions(
        decision.status, decision.sandbox, now=stamp, generation=generation, reason=decision.reason
    )
    status = with_frozen_condition(
        status,
        inputs.frozen_by,
        final=status.phase in FINAL_PHASES,
        now=stamp,
        generation=generation,
    )
    status = status.model_copy(update={"observed_generation": generation})
    events = list(decision.events)
    if status.phase != old.phase:
        kind: EventType = "Warning" if status.phase == "Failed" else "Normal"
        events.append(PlannedEvent(kind, f"Phase{status.phase}", status.message or status.phase))
    new = status.wire()
    return SessionPlan(
        status=new,
        status_changed=new != old.wire(),
        create_sandbox=decision.create_sandbox,
        delete_pod=decision.delete_pod,
        discard_pod=decision.discard_pod,
        delete_session=decision.delete_session,
        harness_url=decision.harness_url,
        requeue_after=decision.requeue_after,
        events=events,
        lineage=decision.lineage,
        pod_ip=decision.pod_ip,
        frozen_by=decision.frozen_by,
        suspend=decision.suspend,
        suspend_pod=decision.suspend_pod,
    )


def with_sandbox_refused(
    status: dict[str, Any], error: str, *, now: datetime, generation: int
) -> dict[str, Any]:
    """`status` after the API server refused the sandbox (e.g. Pod Security, quota, RBAC).

    The session stays Pending and is retried: the cause is usually fixable by an admin.
    """
    held = SessionStatus.model_validate(status).model_copy(
        update={"message": f"the sandbox could not be created: {error}"}
    )
    stamp = now_text(now)
    held = session_conditions(held, "absent", now=stamp, generation=generation)
    conds = set_condition(
        held.conditions,
        "Ready",
        "False",
        R.SANDBOX_REFUSED,
        held.message or "",
        now=stamp,
        generation=generation,
    )
    return held.model_copy(update={"conditions": conds}).wire()
