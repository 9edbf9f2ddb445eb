"""The Session planner's checks, in the order it decides them: each reads one `SessionInputs`
and returns a `SessionDecision`, or None to let the next check decide; the first decision wins,
and a Session none of them decides for is driven at its serving harness (`steady_state`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from corral_api.freeze import FrozenBy
from corral_api.kinds import SessionStatus, SuspendMode
from corral_common.branches import session_refusal

from ..driver import wait_satisfied
from ..naming import ANNOTATION_DRAINED
from ..sandboxspec import SandboxSpecError, check_sandbox
from . import lineage
from . import reasons as R
from ._session_inputs import SessionInputs, parse_time, pending_for, wake_wait
from .agent import agent_ready
from .conditions import set_condition
from .lineage import Lineage, LineageRefusal, out_of_turns_message, spent_axis

SandboxState = Literal["absent", "starting", "ready", "released", "kept"]
EventType = Literal["Normal", "Warning"]

WAIT_RECHECK = 5.0
# Every change of the sandbox pod wakes its Session at once (the operator watches pods), so
# this recheck is a safety net only; a short one was a load of its own (docs/performance.md).
STARTING_RECHECK = 30.0
# A held Session is woken by every change of a Freeze in its namespace; this is the fallback.
FROZEN_RECHECK = 30.0

STARTING_MESSAGE = "waiting for the harness to be ready"
RESUMED = "Resumed"  # the condition's type, and its Event's reason
SUSPENDED_CONDITION = "Suspended"


@dataclass(frozen=True)
class PlannedEvent:
    type: EventType
    reason: str
    message: str


@dataclass(frozen=True)
class SessionDecision:
    """What a check decided: the status and the sandbox state the plan reports, the reason its
    conditions give (None: derived from the phase and the last settlement), what to do."""

    status: SessionStatus
    sandbox: SandboxState
    reason: str | None = None
    create_sandbox: bool = False
    delete_pod: bool = False
    # Delete a dead pod (Failed, not being deleted) without archiving from it first.
    discard_pod: bool = False
    delete_session: bool = False
    harness_url: str | None = None
    requeue_after: float | None = None
    lineage: Lineage | None = None
    pod_ip: str | None = None
    frozen_by: FrozenBy | None = None
    # Suspending: drive the turn in flight only to end it this way (spec.suspendMode).
    suspend: SuspendMode | None = None
    # Suspended: archive the conversation's log from the serving pod, then delete the pod.
    suspend_pod: bool = False
    # The decision's own Events; the plan adds the phase change's after them.
    events: tuple[PlannedEvent, ...] = ()


SessionCheck = Callable[[SessionInputs], SessionDecision | None]


def _failed(inputs: SessionInputs, message: str) -> SessionStatus:
    """The status the Session fails with: Failed, why, no turn in flight, finished now."""
    return inputs.old.model_copy(
        update={"phase": "Failed", "message": message, "ledger": None, "finished_at": inputs.stamp}
    )


def _spec_refused(inputs: SessionInputs, why: object) -> SessionDecision:
    return SessionDecision(_failed(inputs, f"invalid spec: {why}"), "released", R.INVALID_SPEC)


def _pending(inputs: SessionInputs, message: str) -> SessionStatus:
    return inputs.old.model_copy(update={"phase": "Pending", "message": message})


# ---- the spec, and the objects under the sandbox's names.


def spec_invalid(inputs: SessionInputs) -> SessionDecision | None:
    """The Session's spec does not validate: it fails (InvalidSpec); one that had ended stays
    as it ended, its sandbox released."""
    parsed = inputs.parsed
    if not isinstance(parsed, ValidationError):
        return None
    if inputs.ended:
        return SessionDecision(inputs.old, "released")
    first = parsed.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return _spec_refused(inputs, f"{where}: {first['msg']}")


def objects_not_ours(inputs: SessionInputs) -> SessionDecision | None:
    """An object under a sandbox name is not this Session's: it fails (ObjectInTheWay)."""
    foreign = [what for what, owner in inputs.owners.items() if owner == "foreign"]
    if inputs.ended or not foreign:
        return None
    one = len(foreign) == 1
    failed = _failed(
        inputs,
        f"{' and '.join(foreign)} already exist{'s' if one else ''} and "
        f"{'is' if one else 'are'} not owned by this Session; the operator never adopts or "
        "overwrites an object it did not create for this Session: remove it, or give the "
        "Session another name",
    )
    return SessionDecision(failed, "absent", R.OBJECT_IN_THE_WAY)


def earlier_sandbox_going(inputs: SessionInputs) -> SessionDecision | None:
    """Objects of an earlier Session with this name: garbage collection removes them; wait
    (SandboxConflict)."""
    if inputs.ended or "earlier" not in inputs.owners.values():
        return None
    held = inputs.old.model_copy(update={"message": "waiting for an earlier sandbox to go"})
    return SessionDecision(held, "absent", R.SANDBOX_CONFLICT, requeue_after=1.0)


# ---- the session has ended: release the sandbox, then the Session after its TTL.


def _ttl_left(inputs: SessionInputs) -> float | None:
    """Seconds until an ended Session is deleted (spec.ttlSecondsAfterFinished), or None."""
    ttl = inputs.session.spec.ttl_seconds_after_finished
    if ttl is None:
        return None
    finished = parse_time(inputs.old.finished_at) or inputs.now
    return (finished - inputs.now).total_seconds() + ttl


def _released(
    inputs: SessionInputs, *, delete_session: bool, requeue_after: float | None
) -> SessionDecision:
    keep_sandbox = inputs.session.spec.keep_sandbox
    return SessionDecision(
        inputs.old,
        "kept" if keep_sandbox and inputs.pod_alive else "released",
        delete_pod=inputs.pod_alive and not keep_sandbox,
        delete_session=delete_session,
        requeue_after=requeue_after,
    )


def ttl_expired(inputs: SessionInputs) -> SessionDecision | None:
    """The Session ended longer ago than its TTL: delete it (and release its sandbox)."""
    if not inputs.ended:
        return None
    left = _ttl_left(inputs)
    if left is None or left > 0:
        return None
    return _released(inputs, delete_session=True, requeue_after=None)


def ended(inputs: SessionInputs) -> SessionDecision | None:
    """The Session ended: release its sandbox (or keep it: keepSandbox), and come back when its
    TTL runs out."""
    if not inputs.ended:
        return None
    left = _ttl_left(inputs)
    return _released(
        inputs, delete_session=False, requeue_after=None if left is None else max(left, 0.05)
    )


# ---- the Agent must exist and be valid before anything is created.


def agent_missing(inputs: SessionInputs) -> SessionDecision | None:
    """The Agent does not exist (yet): hold the Session Pending (AgentNotFound)."""
    if inputs.agent_body is not None:
        return None
    held = _pending(inputs, f"Agent {inputs.session.spec.agent_ref!r} not found")
    return SessionDecision(held, "absent", R.AGENT_NOT_FOUND, requeue_after=5.0)


def agent_not_ready(inputs: SessionInputs) -> SessionDecision | None:
    """The Agent is not validated (or is invalid): hold the Session Pending (AgentNotReady)."""
    body = inputs.agent_body
    if body is None or agent_ready(body):
        return None
    ready: dict[str, Any] = next(
        (c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"),
        {},
    )
    why = ready.get("message") or "not validated yet"
    held = _pending(inputs, f"Agent {inputs.session.spec.agent_ref!r} is not ready: {why}")
    return SessionDecision(held, "absent", R.AGENT_NOT_READY, requeue_after=5.0)


def agent_invalid(inputs: SessionInputs) -> SessionDecision | None:
    """The Agent does not validate, or no sandbox can be built from it and the Session (the
    pod builder's own check): the Session fails (InvalidSpec)."""
    agent = inputs.parsed_agent
    if isinstance(agent, ValidationError):
        return _spec_refused(inputs, agent)
    try:
        check_sandbox(agent, inputs.session, inputs.settings)
    except (ValidationError, SandboxSpecError) as exc:
        return _spec_refused(inputs, exc)
    return None


# No CRD rule can compare two objects: a budget above the Agent's is refused here, and so is a
# branch outside the Agent's patterns (a child is held to its own Agent's).


def budget_above_agent(inputs: SessionInputs) -> SessionDecision | None:
    """spec.budget is above the Agent's limits.budget: the Session fails (InvalidSpec)."""
    over = lineage.budget_above_agent(inputs.session.spec.budget, inputs.agent.spec.limits.budget)
    return None if over is None else _spec_refused(inputs, over)


def branch_refused(inputs: SessionInputs) -> SessionDecision | None:
    """The session branch is one the Agent does not allow: the Session fails (InvalidSpec)."""
    refusal = session_refusal(inputs.session, inputs.agent)
    return None if refusal is None else _spec_refused(inputs, refusal)


def lineage_refused(inputs: SessionInputs) -> SessionDecision | None:
    """The parent chain refuses the Session: it fails, or is held Pending when the chain cannot
    be judged yet; the refusal names the reason."""
    refusal = inputs.lineage_outcome
    if not isinstance(refusal, LineageRefusal):
        return None
    if refusal.hold:
        held = _pending(inputs, refusal.message)
        return SessionDecision(held, "absent", refusal.reason, requeue_after=5.0)
    failed = _failed(inputs, f"invalid spec: {refusal.message}")
    return SessionDecision(failed, "released", refusal.reason)


def _out_of_turns(inputs: SessionInputs) -> SessionDecision:
    text = out_of_turns_message(inputs.old.turns, inputs.lineage.max_turns)
    return SessionDecision(_failed(inputs, text), "released", R.TURN_LIMIT_REACHED)


# ---- spec.suspend: the turn in flight ends, the conversation is archived, the pod goes.


def _suspended_condition(
    inputs: SessionInputs, status: SessionStatus, value: Literal["True", "False"], why: str
) -> SessionStatus:
    conds = set_condition(
        status.conditions,
        SUSPENDED_CONDITION,
        value,
        why,
        status.message or "",
        now=inputs.stamp,
        generation=inputs.generation,
    )
    return status.model_copy(update={"conditions": conds})


def suspending(inputs: SessionInputs) -> SessionDecision | None:
    """spec.suspend on a Session with a turn in flight at its serving harness: drive the turn
    only to end it, as spec.suspendMode says (Suspending); the next pass parks it."""
    spec = inputs.session.spec
    if not spec.suspend or inputs.old.phase == "Suspended" or inputs.old.ledger is None:
        return None
    if not inputs.serving:
        return None  # nothing serves the turn: parked as it stands (`suspended`)
    mode = spec.suspend_mode or "afterTurn"
    how = "finishes first" if mode == "afterTurn" else "is aborted"
    text = f"suspending: turn {inputs.old.ledger.turn} {how}, then the pod goes"
    status = inputs.seen.model_copy(update={"message": text})
    return SessionDecision(
        _suspended_condition(inputs, status, "False", R.SUSPENDING),
        "ready",
        R.SUSPENDING,
        harness_url=inputs.harness_url,
        lineage=inputs.lineage,
        pod_ip=inputs.pod_ip,
        suspend=mode,
        frozen_by=inputs.frozen_by,  # a Freeze wins: the turn is interrupted as it says
    )


def suspended(inputs: SessionInputs) -> SessionDecision | None:
    """spec.suspend with no turn in flight (or none that a harness serves): park the Session.
    With an archive its conversation's log is archived and its pod deleted, so it costs
    nothing; without one the pod is kept, idle, since nothing else could resume it. A parked
    Session whose spec.suspend is false again resumes (`unsuspended`)."""
    old, pod = inputs.old, inputs.sandbox_pod
    wanted = inputs.session.spec.suspend
    if old.phase != "Suspended" and not wanted:
        return None
    archives = inputs.settings.archives
    if old.phase == "Suspended" and not wanted and (pod is None or not archives):
        return None  # resumes
    if pod is not None and not inputs.pod_alive:  # going, or dead: wait until it is gone
        dead = not (pod.get("metadata") or {}).get("deletionTimestamp")
        return SessionDecision(
            _parked(inputs, released=True), "released", R.SUSPENDED, requeue_after=1.0,
            discard_pod=dead,
        )  # fmt: skip
    if pod is not None and not archives:
        return SessionDecision(_parked(inputs, released=False), "kept", R.SUSPENDED)
    parked = _parked(inputs, released=pod is None or archives)
    # The log is read from a serving harness before its pod goes; one that does not serve
    # (still starting) has written nothing the archive lacks.
    return SessionDecision(
        parked, "released", R.SUSPENDED, suspend_pod=pod is not None,
        requeue_after=1.0 if pod is not None else None,
        pod_ip=inputs.pod_ip if pod is not None and inputs.serving else None,
    )  # fmt: skip


def _parked(inputs: SessionInputs, *, released: bool) -> SessionStatus:
    """The status of a parked Session: Suspended, from the phase it resumes in; counted once,
    and only when its pod goes (a new pod restores the conversation from the archive)."""
    old = inputs.old
    if old.phase == "Suspended":
        return old
    if released:
        text = "suspended (spec.suspend): the conversation is archived and the pod released"
    else:
        text = (
            "suspended (spec.suspend): no turn is admitted; the pod is kept, idle, since no "
            "archive is configured to resume it from"
        )
    parked = old.model_copy(
        update={
            "phase": "Suspended",
            "suspended_from": old.phase,
            "suspensions": old.suspensions + (1 if released else 0),
            "pod_name": None if released else old.pod_name,
            "message": text,
        }
    )
    return _suspended_condition(inputs, parked, "True", R.SUSPENDED)


def unsuspended(inputs: SessionInputs) -> SessionDecision | None:
    """A parked Session whose spec.suspend is false again: back to the phase it was parked
    in; a new pod restores its conversation, or its kept pod serves on."""
    old = inputs.old
    if old.phase != "Suspended" or inputs.session.spec.suspend:
        return None
    text = "resumed (spec.suspend is false): " + (
        "a new pod restores the conversation" if old.pod_name is None else "the kept pod serves"
    )
    back = old.model_copy(
        update={"phase": old.suspended_from or "Pending", "suspended_from": None, "message": text}
    )
    back = _suspended_condition(inputs, back, "False", R.UNSUSPENDED)
    event = PlannedEvent("Normal", R.UNSUSPENDED, text)
    return SessionDecision(
        back, "absent" if old.pod_name is None else "ready", R.UNSUSPENDED, requeue_after=0.05,
        lineage=inputs.lineage, events=(event,),
    )  # fmt: skip


# ---- no living pod: it was lost, it is still going, or it is to be created.


def pod_lost(inputs: SessionInputs) -> SessionDecision | None:
    """The pod went away after it was made. With an archive (the conversation is kept there
    at every turn's admission and end) and restarts left, the Session resumes in a new pod
    (Resumed); otherwise it fails (SandboxLost)."""
    old = inputs.old
    if inputs.pod_alive or not old.pod_name:
        return None
    if not (old.turns or old.ledger or old.phase != "Pending"):
        return None
    reason, how = lost_cause(inputs.pod)
    limit = inputs.agent.spec.limits.max_restarts
    if not inputs.settings.archives:
        lost = _failed(inputs, f"the sandbox pod {old.pod_name} was lost")
        return SessionDecision(lost, "released", R.SANDBOX_LOST)
    if old.restarts >= limit:
        text = (
            f"the sandbox pod {old.pod_name} was lost ({how}) after {old.restarts} restarts, "
            f"its Agent's spec.limits.maxRestarts"
        )
        return SessionDecision(_failed(inputs, text), "released", R.SANDBOX_LOST)
    text = (
        f"the sandbox pod {old.pod_name} was lost ({how}): the Session resumes in a new pod "
        f"(restart {old.restarts + 1} of at most {limit})"
    )
    conds = set_condition(
        old.conditions,
        RESUMED,
        "True",
        reason,
        text,
        now=inputs.stamp,
        generation=inputs.generation,
    )
    resumed = old.model_copy(
        update={
            "restarts": old.restarts + 1,
            "pod_name": None,
            "message": text,
            "conditions": conds,
        }
    )
    event = PlannedEvent("Warning", RESUMED, text)
    return SessionDecision(resumed, "absent", R.RESUMING, requeue_after=1.0, events=(event,))


def lost_cause(pod: dict[str, Any] | None) -> tuple[str, str]:
    """How a pod was lost, as the Resumed condition's reason and in words."""
    status = (pod or {}).get("status") or {}
    drained = ((pod or {}).get("metadata") or {}).get("annotations", {}).get(ANNOTATION_DRAINED)
    if drained == R.VERSION_SKEW:
        return R.VERSION_SKEW, "drained: its harness speaks a wire version no longer driven"
    if status.get("reason") == "NodeLost":
        return R.NODE_LOST, "its node stopped answering"
    if status.get("reason") == "Evicted":
        return R.POD_EVICTED, f"evicted: {status.get('message') or 'node pressure'}"
    return R.POD_DELETED, "deleted"


def pod_terminating(inputs: SessionInputs) -> SessionDecision | None:
    """A pod from an earlier life is still terminating: wait for it to go. One that is dead
    but not being deleted (evicted by its kubelet, Failed) is deleted first: its name is the
    new pod's (its history was archived as the conversation went)."""
    pod = inputs.sandbox_pod
    if inputs.pod_alive or pod is None:
        return None
    dead = not (pod.get("metadata") or {}).get("deletionTimestamp")
    return SessionDecision(inputs.old, "absent", requeue_after=1.0, discard_pod=dead)


def no_turn_to_start(inputs: SessionInputs) -> SessionDecision | None:
    """No turn is left before the sandbox is made: the Session fails (TurnLimitReached)."""
    if inputs.pod_alive or inputs.old.turns < inputs.lineage.max_turns:
        return None
    return _out_of_turns(inputs)


def frozen_before_start(inputs: SessionInputs) -> SessionDecision | None:
    """A Freeze holds the Session: nothing new while it holds, not even the sandbox (Frozen)."""
    if inputs.pod_alive or inputs.frozen_by is None:
        return None
    held = inputs.old.model_copy(update={"message": inputs.frozen_by.describe()})
    return SessionDecision(held, "absent", R.FROZEN, requeue_after=FROZEN_RECHECK)


def budget_spent_before_start(inputs: SessionInputs) -> SessionDecision | None:
    """Nothing is left of the budget (its own, or its parent's remainder) before the session
    starts: it fails (BudgetExceeded)."""
    spent = None if inputs.pod_alive else spent_axis(inputs.lineage.budget)
    if spent is None:
        return None
    text = f"the budget is spent before the session starts: nothing left in {spent}"
    if inputs.session.spec.parent_ref is not None:
        text += " (the parent session's remainder)"
    return SessionDecision(_failed(inputs, text), "released", R.BUDGET_EXCEEDED)


def create_sandbox(inputs: SessionInputs) -> SessionDecision | None:
    """No pod yet: create the sandbox (CreatingSandbox)."""
    if inputs.pod_alive:
        return None
    # Written once the pod is created (a refusal rewrites it): the status the passes that see
    # the pod starting compute too, so they write nothing (one write per Session less).
    pod_name = inputs.pod_name
    created = inputs.old.model_copy(update={"pod_name": pod_name, "message": STARTING_MESSAGE})
    return SessionDecision(
        created,
        "starting",
        R.CREATING_SANDBOX,
        create_sandbox=True,
        lineage=inputs.lineage,
        events=(PlannedEvent("Normal", "SandboxCreating", f"creating pod {pod_name}"),),
    )


# ---- the pod lives: it starts, or its harness serves.


def sandbox_starting(inputs: SessionInputs) -> SessionDecision | None:
    """The pod lives but its harness does not serve yet: wait (CreatingSandbox while the
    Session is Pending)."""
    if inputs.serving:
        return None
    status = inputs.seen
    creating: str | None = None
    if status.phase == "Pending":
        status = status.model_copy(update={"message": STARTING_MESSAGE})
        creating = R.CREATING_SANDBOX
    return SessionDecision(
        status, "starting", creating, requeue_after=STARTING_RECHECK, lineage=inputs.lineage
    )


def _serving_status(inputs: SessionInputs) -> SessionStatus:
    status = inputs.seen
    if status.phase == "Pending":
        return status.model_copy(update={"message": "the harness is ready"})
    return status


def frozen_in_flight(inputs: SessionInputs) -> SessionDecision | None:
    """A Freeze holds the Session while its turn is in flight: drive it only to interrupt the
    turn (Frozen)."""
    status = _serving_status(inputs)
    if inputs.frozen_by is None or status.ledger is None:
        return None
    return SessionDecision(
        status,
        "ready",
        R.FROZEN,
        harness_url=inputs.harness_url,
        lineage=inputs.lineage,
        pod_ip=inputs.pod_ip,
        frozen_by=inputs.frozen_by,
    )


def frozen_between_turns(inputs: SessionInputs) -> SessionDecision | None:
    """A Freeze holds the Session between turns: admit nothing while it holds (Frozen)."""
    if inputs.frozen_by is None:
        return None
    held = _serving_status(inputs).model_copy(update={"message": inputs.frozen_by.describe()})
    return SessionDecision(
        held, "ready", R.FROZEN, requeue_after=FROZEN_RECHECK, lineage=inputs.lineage
    )


def _waiting_for_wake(status: SessionStatus) -> bool:
    return status.ledger is None and status.phase == "WaitingForWake"


def wake_cancelled(inputs: SessionInputs) -> SessionDecision | None:
    """The wake was taken out of the spec while the Session waited for it: it ends
    (Completed)."""
    status = _serving_status(inputs)
    if not _waiting_for_wake(status):
        return None
    wait = wake_wait(status, inputs.session, inputs.now)
    if not isinstance(wait, SessionStatus):
        return None
    return SessionDecision(wait, "ready", R.COMPLETED, lineage=inputs.lineage)


def wake_not_due(inputs: SessionInputs) -> SessionDecision | None:
    """The wake is not due yet: come back when it is (the due time is in status, so a restart
    keeps it)."""
    status = _serving_status(inputs)
    if not _waiting_for_wake(status):
        return None
    wait = wake_wait(status, inputs.session, inputs.now)
    if isinstance(wait, SessionStatus) or wait <= 0:
        return None
    return SessionDecision(status, "ready", requeue_after=wait, lineage=inputs.lineage)


# A turn that ended waiting resumes only once what it waits for is there; re-admitting at once
# would spin. The driver then admits the follow-up itself.


def waiting_for_children(inputs: SessionInputs) -> SessionDecision | None:
    """The Session waits for its children, and its wait is not satisfied yet: come back."""
    status = _serving_status(inputs)
    if status.ledger is not None or status.phase != "WaitingForChildren":
        return None
    if wait_satisfied(status.waiting_for, inputs.children or [], status.reported_children):
        return None
    return SessionDecision(status, "ready", requeue_after=WAIT_RECHECK, lineage=inputs.lineage)


def waiting_for_human(inputs: SessionInputs) -> SessionDecision | None:
    """The Session waits for a person: a question for `corral reply` (spec.replies), an ask
    for its Approval's decision; not there yet: come back."""
    status = _serving_status(inputs)
    if status.ledger is not None or status.phase != "WaitingForHuman":
        return None
    if status.question:
        waiting = len(inputs.session.spec.replies) <= status.replies_read
    else:
        approvals = inputs.approvals
        waiting = approvals is None or any(pending_for(a, inputs.uid) for a in approvals)
    if not waiting:
        return None
    return SessionDecision(status, "ready", requeue_after=WAIT_RECHECK, lineage=inputs.lineage)


def turn_limit_reached(inputs: SessionInputs) -> SessionDecision | None:
    """No turn in flight and none left: the next admission would be one turn too many; the
    Session fails (TurnLimitReached)."""
    if inputs.old.ledger is not None or inputs.old.turns < inputs.lineage.max_turns:
        return None
    return _out_of_turns(inputs)


def steady_state(inputs: SessionInputs) -> SessionDecision:
    """The harness serves and nothing holds the Session: the driver runs its turns there."""
    return SessionDecision(
        _serving_status(inputs),
        "ready",
        harness_url=inputs.harness_url,
        lineage=inputs.lineage,
        pod_ip=inputs.pod_ip,
    )


# The order is the planner's: each check may assume that those before it passed.
SESSION_CHECKS: tuple[SessionCheck, ...] = (
    spec_invalid,
    objects_not_ours,
    earlier_sandbox_going,
    ttl_expired,
    ended,
    agent_missing,
    agent_not_ready,
    agent_invalid,
    budget_above_agent,
    branch_refused,
    lineage_refused,
    suspending,
    suspended,
    unsuspended,
    pod_lost,
    pod_terminating,
    no_turn_to_start,
    frozen_before_start,
    budget_spent_before_start,
    create_sandbox,
    sandbox_starting,
    frozen_in_flight,
    frozen_between_turns,
    wake_cancelled,
    wake_not_due,
    waiting_for_children,
    waiting_for_human,
    turn_limit_reached,
)


def decide_session(inputs: SessionInputs) -> SessionDecision:
    """The first decision of the chain, or the steady state when no check decides."""
    for check in SESSION_CHECKS:
        decision = check(inputs)
        if decision is not None:
            return decision
    return steady_state(inputs)
