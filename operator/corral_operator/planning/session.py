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

from pydantic import ValidationError

from corral_api import API_VERSION
from corral_api.freeze import FrozenBy
from corral_api.kinds import Agent, ChildrenSummary, Session, SessionStatus
from corral_api.timestamps import parse_rfc3339, rfc3339
from corral_common.branches import session_refusal

from .. import naming
from ..driver import wait_satisfied
from ..podbuilder import SandboxSpecError, build_pod
from ..settings import OperatorSettings
from . import reasons as R
from .agent import agent_ready
from .conditions import get_condition, remove_condition, set_condition
from .freeze import with_frozen_condition
from .lineage import (
    Lineage,
    LineageRefusal,
    budget_above_agent,
    derive_lineage,
    out_of_turns_message,
    spent_axis,
)

FINAL = frozenset({"Succeeded", "Failed", "Stopped"})
SandboxState = Literal["absent", "starting", "ready", "released", "kept"]
EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class PlannedEvent:
    type: EventType
    reason: str
    message: str


@dataclass(frozen=True)
class SessionPlan:
    status: dict[str, Any]
    status_changed: bool
    create_sandbox: bool = False
    delete_pod: bool = False
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

    @property
    def drive(self) -> bool:
        return self.harness_url is not None


now_text = rfc3339
parse_time = parse_rfc3339


def pod_is_ready(pod: dict[str, Any] | None) -> bool:
    if not pod or pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if not status.get("podIP"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


WAIT_RECHECK = 5.0
# Every change of the sandbox pod wakes its Session at once (the operator watches pods), so
# this recheck is a safety net only; at 5 s, 1,000 starting Sessions polled 200 times a second.
STARTING_RECHECK = 30.0
# A held Session is woken by every change of a Freeze in its namespace; this is the fallback.
FROZEN_RECHECK = 30.0


def summarize_children(children: list[dict[str, Any]]) -> ChildrenSummary:
    phases = [str((c.get("status") or {}).get("phase") or "Pending") for c in children]
    return ChildrenSummary(
        total=len(phases),
        running=sum(p not in FINAL for p in phases),
        succeeded=sum(p == "Succeeded" for p in phases),
        failed=sum(p in ("Failed", "Stopped") for p in phases),
    )


def _pending_for(approval: dict[str, Any], uid: str) -> bool:
    ref = (approval.get("spec") or {}).get("sessionRef") or {}
    decision = (approval.get("status") or {}).get("decision") or "Pending"
    return bool(ref.get("uid") == uid and decision == "Pending")


Ownership = Literal["ours", "earlier", "foreign"]


def ownership(obj: dict[str, Any], name: str, uid: str) -> Ownership:
    """Whose an object with the name the sandbox needs is.

    `ours`: this Session (its uid) is its controller. `earlier`: it belongs only to an earlier
    Session of the same name, which is gone (names are unique), so the garbage collector
    removes it; wait. `foreign`: anything else. The operator never adopts and never overwrites.
    """
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    if any(ref.get("uid") == uid and ref.get("controller") is True for ref in refs):
        return "ours"
    if refs and all(
        ref.get("kind") == "Session"
        and ref.get("apiVersion") == API_VERSION
        and ref.get("name") == name
        and ref.get("uid") != uid
        for ref in refs
    ):
        return "earlier"
    return "foreign"


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


STARTING_MESSAGE = "waiting for the harness to be ready"


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
    if status.phase in FINAL:
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


def _finish(
    status: SessionStatus, phase: Literal["Failed"], message: str, now: str
) -> SessionStatus:
    return status.model_copy(
        update={"phase": phase, "message": message, "ledger": None, "finished_at": now}
    )


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
    """
    stamp = now_text(now)
    md = body.get("metadata") or {}
    generation = int(md.get("generation") or 0)
    old = SessionStatus.model_validate(body.get("status") or {})
    events: list[PlannedEvent] = []

    def result(
        status: SessionStatus, sandbox: SandboxState, reason: str | None = None, **kw: Any
    ) -> SessionPlan:
        status = session_conditions(
            status, sandbox, now=stamp, generation=generation, reason=reason
        )
        status = with_frozen_condition(
            status, frozen_by, final=status.phase in FINAL, now=stamp, generation=generation
        )
        status = status.model_copy(update={"observed_generation": generation})
        if status.phase != old.phase:
            kind: EventType = "Warning" if status.phase == "Failed" else "Normal"
            events.append(
                PlannedEvent(kind, f"Phase{status.phase}", status.message or status.phase)
            )
        new = status.wire()
        return SessionPlan(status=new, status_changed=new != old.wire(), events=events, **kw)

    try:
        session = Session.model_validate({k: body.get(k) for k in ("metadata", "spec")})
    except ValidationError as exc:
        if old.phase in FINAL:
            return result(old, "released")
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return result(
            _finish(old, "Failed", f"invalid spec: {where}: {first['msg']}", stamp),
            "released",
            R.INVALID_SPEC,
        )

    name, uid = str(md.get("name", "")), str(md.get("uid", ""))
    # Objects under the sandbox's names: used only when this Session controls them.
    owners: dict[str, Ownership] = {
        f"{kind} {obj.get('metadata', {}).get('name', '')}": ownership(obj, name, uid)
        for kind, obj in sorted((existing or {}).items())
    }
    if pod is not None:
        owners[f"Pod {pod.get('metadata', {}).get('name', '')}"] = ownership(pod, name, uid)
        if old.phase in FINAL and ownership(pod, name, uid) != "ours":
            pod = None  # never release a pod that is not ours
    foreign = [what for what, owner in owners.items() if owner == "foreign"]
    if old.phase not in FINAL and foreign:
        one = len(foreign) == 1
        failed = _finish(
            old,
            "Failed",
            f"{' and '.join(foreign)} already exist{'s' if one else ''} and "
            f"{'is' if one else 'are'} not owned by this Session; the operator never adopts or "
            "overwrites an object it did not create for this Session: remove it, or give the "
            "Session another name",
            stamp,
        )
        return result(failed, "absent", R.OBJECT_IN_THE_WAY)
    if old.phase not in FINAL and "earlier" in owners.values():
        # Objects of an earlier Session with this name: garbage collection removes them.
        held = old.model_copy(update={"message": "waiting for an earlier sandbox to go"})
        return result(held, "absent", R.SANDBOX_CONFLICT, requeue_after=1.0)
    pod_alive = pod is not None and not pod.get("metadata", {}).get("deletionTimestamp")

    # ---- the session has ended: release the sandbox, then the Session after its TTL.
    if old.phase in FINAL:
        keep = session.spec.keep_sandbox and pod_alive
        requeue: float | None = None
        delete_session = False
        ttl = session.spec.ttl_seconds_after_finished
        finished = parse_time(old.finished_at) or now
        if ttl is not None:
            left = (finished - now).total_seconds() + ttl
            delete_session = left <= 0
            requeue = None if delete_session else max(left, 0.05)
        return result(
            old,
            "kept" if keep else "released",
            delete_pod=pod_alive and not session.spec.keep_sandbox,
            delete_session=delete_session,
            requeue_after=requeue,
        )

    # ---- the Agent must exist and be valid before anything is created.
    if agent_body is None:
        held = old.model_copy(
            update={"phase": "Pending", "message": f"Agent {session.spec.agent_ref!r} not found"}
        )
        return result(held, "absent", R.AGENT_NOT_FOUND, requeue_after=5.0)
    if not agent_ready(agent_body):
        ready: dict[str, Any] = next(
            (
                c
                for c in (agent_body.get("status") or {}).get("conditions") or []
                if c.get("type") == "Ready"
            ),
            {},
        )
        why = ready.get("message") or "not validated yet"
        held = old.model_copy(
            update={
                "phase": "Pending",
                "message": f"Agent {session.spec.agent_ref!r} is not ready: {why}",
            }
        )
        return result(held, "absent", R.AGENT_NOT_READY, requeue_after=5.0)
    try:
        agent = Agent.model_validate({k: agent_body.get(k) for k in ("metadata", "spec")})
        build_pod(agent, session, settings)
    except (ValidationError, SandboxSpecError) as exc:
        return result(
            _finish(old, "Failed", f"invalid spec: {exc}", stamp), "released", R.INVALID_SPEC
        )
    # No CRD rule can compare two objects: a budget above the Agent's is refused here, and so
    # is a branch outside the Agent's patterns (a child is held to its own Agent's).
    over = budget_above_agent(session.spec.budget, agent.spec.limits.budget)
    if over is None:
        over = session_refusal(session, agent)
    if over is not None:
        return result(
            _finish(old, "Failed", f"invalid spec: {over}", stamp), "released", R.INVALID_SPEC
        )
    # ---- where the Session sits in its tree: depth, turns and budget, derived, never read.
    lineage = derive_lineage(body, agent.spec, parents or [], ancestor_agents or {})
    if isinstance(lineage, LineageRefusal):
        if lineage.hold:
            held = old.model_copy(update={"phase": "Pending", "message": lineage.message})
            return result(held, "absent", lineage.reason, requeue_after=5.0)
        failed = _finish(old, "Failed", f"invalid spec: {lineage.message}", stamp)
        return result(failed, "released", lineage.reason)

    def out_of_turns() -> SessionPlan:
        assert isinstance(lineage, Lineage)
        text = out_of_turns_message(old.turns, lineage.max_turns)
        return result(_finish(old, "Failed", text, stamp), "released", R.TURN_LIMIT_REACHED)

    pod_name = naming.pod_name(name)
    # ---- the pod went away after it was made: the conversation went with it.
    if not pod_alive:
        if old.pod_name and (old.turns or old.ledger or old.phase != "Pending"):
            lost = _finish(old, "Failed", f"the sandbox pod {old.pod_name} was lost", stamp)
            return result(lost, "released", R.SANDBOX_LOST)
        if pod is not None:  # still terminating from an earlier life; wait for it to go
            return result(old, "absent", requeue_after=1.0)
        if old.turns >= lineage.max_turns:
            return out_of_turns()
        if frozen_by is not None:  # nothing new while frozen: not even the sandbox
            held = old.model_copy(update={"message": frozen_by.describe()})
            return result(held, "absent", R.FROZEN, requeue_after=FROZEN_RECHECK)
        spent = spent_axis(lineage.budget)
        if spent is not None:
            text = f"the budget is spent before the session starts: nothing left in {spent}"
            if session.spec.parent_ref is not None:
                text += " (the parent session's remainder)"
            return result(_finish(old, "Failed", text, stamp), "released", R.BUDGET_EXCEEDED)
        # Written once the pod is created (a refusal rewrites it): the status the passes that
        # see the pod starting compute too, so they write nothing (one write per Session less).
        created = old.model_copy(update={"pod_name": pod_name, "message": STARTING_MESSAGE})
        events.append(PlannedEvent("Normal", "SandboxCreating", f"creating pod {pod_name}"))
        return result(created, "starting", R.CREATING_SANDBOX, create_sandbox=True, lineage=lineage)

    assert pod is not None
    status = old.model_copy(update={"pod_name": pod["metadata"].get("name", pod_name)})
    if children is not None:
        status = status.model_copy(update={"children": summarize_children(children)})
    if pod_is_ready(pod):
        ip = pod["status"]["podIP"]
        url = f"http://{ip}:{settings.harness_port}"
        if status.phase == "Pending":
            status = status.model_copy(update={"message": "the harness is ready"})
        if frozen_by is not None:
            if status.ledger is not None:  # in flight: re-attach only to interrupt it
                return result(
                    status, "ready", R.FROZEN, harness_url=url, lineage=lineage, pod_ip=ip,
                    frozen_by=frozen_by,
                )  # fmt: skip
            held = status.model_copy(update={"message": frozen_by.describe()})
            return result(held, "ready", R.FROZEN, requeue_after=FROZEN_RECHECK, lineage=lineage)
        if status.ledger is None and status.phase == "WaitingForWake":
            wait = wake_wait(status, session, now)
            if isinstance(wait, SessionStatus):  # the wake was taken out of the spec
                return result(wait, "ready", R.COMPLETED, lineage=lineage)
            if wait > 0:  # not woken yet; the due time is in status, so a restart keeps it
                return result(status, "ready", requeue_after=wait, lineage=lineage)
        # A turn that ended waiting resumes only once what it waits for is there; re-admitting
        # at once would spin. The driver then admits the follow-up itself.
        waiting = status.ledger is None and (
            (
                status.phase == "WaitingForChildren"
                and not wait_satisfied(status.waiting_for, children or [], status.reported_children)
            )
            or (
                status.phase == "WaitingForHuman"
                and (
                    # A question waits for `corral reply` (spec.replies); an ask, its Approval.
                    len(session.spec.replies) <= status.replies_read
                    if status.question
                    else approvals is None or any(_pending_for(a, uid) for a in approvals)
                )
            )
        )
        if waiting:
            return result(status, "ready", requeue_after=WAIT_RECHECK, lineage=lineage)
        if status.ledger is None and status.turns >= lineage.max_turns:
            return out_of_turns()  # the next admission would be one turn too many
        return result(status, "ready", harness_url=url, lineage=lineage, pod_ip=ip)
    creating: str | None = None
    if status.phase == "Pending":
        status = status.model_copy(update={"message": STARTING_MESSAGE})
        creating = R.CREATING_SANDBOX
    return result(status, "starting", creating, requeue_after=STARTING_RECHECK, lineage=lineage)


def wake_wait(status: SessionStatus, session: Session, now: datetime) -> float | SessionStatus:
    """A Session in WaitingForWake: seconds until its wake is due (0: admit it now), or the
    status it ends with when `spec.wake` was removed while it waited (the wake is cancelled)."""
    if session.spec.wake is None:
        return status.model_copy(
            update={
                "phase": "Succeeded",
                "message": "the wake was removed from the spec; the session ends",
                "finished_at": now_text(now),
            }
        )
    due = parse_time(status.wake_at)
    return 0.0 if due is None else max((due - now).total_seconds(), 0.0)


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
