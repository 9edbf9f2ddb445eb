"""The Session planner: from the Session, its Agent and its pod, decide what to do next.

The turn driver owns the turn fields of the status (phase while running, turns, ledger,
settlements, usage); this planner owns the sandbox's lifecycle and the conditions, and it
settles the phase only where the driver cannot: before the first turn and when the sandbox
is lost or the spec cannot work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError

from corral_api.kinds import Agent, ChildrenSummary, Session, SessionStatus

from .. import naming
from ..podbuilder import SandboxSpecError, build_pod
from ..settings import OperatorSettings
from .agent import agent_ready
from .conditions import remove_condition, set_condition

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

    @property
    def drive(self) -> bool:
        return self.harness_url is not None


def now_text(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


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


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def _final_reason(status: SessionStatus) -> str:
    if status.phase == "Succeeded":
        return "EvaluationPassed" if status.evaluation_turns else "Completed"
    if status.phase == "Stopped":
        return "Stopped"
    last = status.last_settlement
    if last is not None and last.status == "failed":
        return "TurnFailed"
    if last is not None and last.status == "aborted":
        return "TurnAborted"
    if status.evaluation_turns:
        return "EvaluationFailed"
    return "Failed"


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
        "absent": ("False", "SandboxPending", "the sandbox pod is not created yet"),
        "starting": ("False", "SandboxStarting", "waiting for the harness to be ready"),
        "ready": ("True", "SandboxReady", "the harness is serving"),
        "released": ("False", "SandboxReleased", "the sandbox pod was removed"),
        "kept": ("True", "SandboxKept", "the sandbox pod is kept (keepSandbox)"),
    }[sandbox]
    put("Ready", ready_reason[0], ready_reason[1], ready_reason[2])  # type: ignore[arg-type]
    if status.phase in FINAL:
        why = reason or _final_reason(status)
        put("Progressing", "False", why, message)
        put("Succeeded", "True" if status.phase == "Succeeded" else "False", why, message)
        if status.phase == "Failed":
            put("Failed", "True", why, message)
        else:
            conds = remove_condition(conds, "Failed")
    else:
        if status.ledger is not None:
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
) -> SessionPlan:
    """Decide the next actions and the status for one Session.

    `children` are the Sessions this one started (labelled with its uid); `approvals` are the
    namespace's Approvals, read only while the Session waits for a human.
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
            "InvalidSpec",
        )

    name = str(md.get("name", ""))
    if pod is not None and not _owned_by(pod, str(md.get("uid", ""))):
        # A pod of an earlier Session with this name: garbage collection will remove it.
        if old.phase in FINAL:
            pod = None
        else:
            held = old.model_copy(update={"message": "waiting for an earlier sandbox to go"})
            return result(held, "absent", "SandboxConflict", requeue_after=1.0)
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
        return result(held, "absent", "AgentNotFound", requeue_after=5.0)
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
        return result(held, "absent", "AgentNotReady", requeue_after=5.0)
    try:
        agent = Agent.model_validate({k: agent_body.get(k) for k in ("metadata", "spec")})
        build_pod(agent, session, settings)
    except (ValidationError, SandboxSpecError) as exc:
        return result(
            _finish(old, "Failed", f"invalid spec: {exc}", stamp), "released", "InvalidSpec"
        )

    pod_name = naming.pod_name(name)
    # ---- the pod went away after it was made: the conversation went with it.
    if not pod_alive:
        if old.pod_name and (old.turns or old.ledger or old.phase != "Pending"):
            lost = _finish(old, "Failed", f"the sandbox pod {old.pod_name} was lost", stamp)
            return result(lost, "released", "SandboxLost")
        if pod is not None:  # still terminating from an earlier life; wait for it to go
            return result(old, "absent", requeue_after=1.0)
        created = old.model_copy(update={"pod_name": pod_name, "message": "creating the sandbox"})
        events.append(PlannedEvent("Normal", "SandboxCreating", f"creating pod {pod_name}"))
        return result(created, "absent", "CreatingSandbox", create_sandbox=True)

    assert pod is not None
    status = old.model_copy(update={"pod_name": pod["metadata"].get("name", pod_name)})
    if children is not None:
        status = status.model_copy(update={"children": summarize_children(children)})
    if pod_is_ready(pod):
        ip = pod["status"]["podIP"]
        url = f"http://{ip}:{settings.harness_port}"
        if status.phase == "Pending":
            status = status.model_copy(update={"message": "the harness is ready"})
        # A turn that ended waiting resumes only once what it waits for is there; re-admitting
        # at once would spin. The driver then admits the follow-up itself.
        uid = str(md.get("uid", ""))
        waiting = status.ledger is None and (
            (status.phase == "WaitingForChildren" and status.children.running > 0)
            or (
                status.phase == "WaitingForHuman"
                and (approvals is None or any(_pending_for(a, uid) for a in approvals))
            )
        )
        if waiting:
            return result(status, "ready", requeue_after=WAIT_RECHECK)
        return result(status, "ready", harness_url=url)
    if status.phase == "Pending":
        status = status.model_copy(update={"message": "waiting for the harness to be ready"})
    return result(status, "starting", requeue_after=5.0)


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
        "SandboxRefused",
        held.message or "",
        now=stamp,
        generation=generation,
    )
    return held.model_copy(update={"conditions": conds}).wire()
