"""What one pass of the Session planner decides from: the objects it is given, frozen in one
`SessionInputs`, and what it reads off them (who owns the sandbox's objects, whether the pod
serves, what the Agent and the parent chain allow, when a wake is due)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

from pydantic import ValidationError

from corral_api import API_VERSION
from corral_api.decisions import PENDING, approval_decision
from corral_api.freeze import FrozenBy
from corral_api.kinds import FINAL_PHASES, Agent, ChildrenSummary, Session, SessionStatus
from corral_api.timestamps import parse_rfc3339, rfc3339

from .. import naming
from ..settings import OperatorSettings
from ._validated import validated
from .lineage import Lineage, LineageRefusal, derive_lineage

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


def summarize_children(children: list[dict[str, Any]]) -> ChildrenSummary:
    phases = [str((c.get("status") or {}).get("phase") or "Pending") for c in children]
    return ChildrenSummary(
        total=len(phases),
        running=sum(p not in FINAL_PHASES for p in phases),
        succeeded=sum(p == "Succeeded" for p in phases),
        failed=sum(p in ("Failed", "Stopped") for p in phases),
    )


def pending_for(approval: dict[str, Any], uid: str) -> bool:
    """Whether `approval` is one of the Session `uid`'s and still waits for a decision."""
    ref = (approval.get("spec") or {}).get("sessionRef") or {}
    return bool(ref.get("uid") == uid and approval_decision(approval) == PENDING)


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


# A pod in one of these phases runs nothing again (restartPolicy Always never ends a pod
# Succeeded or Failed except by eviction or its node's loss).
DEAD_POD_PHASES = frozenset({"Failed", "Succeeded"})


@dataclass(frozen=True)
class SessionInputs:
    """Everything `plan_session` is given (its parameters, by the same names), and what is read
    off it, each read once, when a check first asks.

    A read may assume that the checks before the first one that asks for it passed: `session`
    is there once the spec is valid, `agent` once the Agent exists and validates, `lineage`
    once the parent chain allows the Session, `seen` once its pod lives.
    """

    body: dict[str, Any]
    agent_body: dict[str, Any] | None
    pod: dict[str, Any] | None
    settings: OperatorSettings
    now: datetime
    children: list[dict[str, Any]] | None = None
    approvals: list[dict[str, Any]] | None = None
    parents: list[dict[str, Any]] | None = None
    ancestor_agents: dict[str, dict[str, Any] | None] | None = None
    existing: dict[str, dict[str, Any]] | None = None
    frozen_by: FrozenBy | None = None

    @cached_property
    def stamp(self) -> str:
        return now_text(self.now)

    @cached_property
    def metadata(self) -> dict[str, Any]:
        md: dict[str, Any] = self.body.get("metadata") or {}
        return md

    @cached_property
    def generation(self) -> int:
        return int(self.metadata.get("generation") or 0)

    @cached_property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @cached_property
    def uid(self) -> str:
        return str(self.metadata.get("uid", ""))

    @cached_property
    def old(self) -> SessionStatus:
        """The status as the Session carries it now."""
        return SessionStatus.model_validate(self.body.get("status") or {})

    @property
    def ended(self) -> bool:
        return self.old.phase in FINAL_PHASES

    @cached_property
    def parsed(self) -> Session | ValidationError:
        """The Session's metadata and spec, validated, or why they do not validate."""
        return validated(Session, self.body)

    @property
    def session(self) -> Session:
        parsed = self.parsed
        if isinstance(parsed, ValidationError):
            raise parsed
        return parsed

    @cached_property
    def owners(self) -> dict[str, Ownership]:
        """Whose each object under the sandbox's names is, by `<Kind> <name>`: they are used
        only when this Session controls them."""
        owners: dict[str, Ownership] = {
            f"{kind} {obj.get('metadata', {}).get('name', '')}": ownership(obj, self.name, self.uid)
            for kind, obj in sorted((self.existing or {}).items())
        }
        if self.pod is not None:
            pod_name = self.pod.get("metadata", {}).get("name", "")
            owners[f"Pod {pod_name}"] = ownership(self.pod, self.name, self.uid)
        return owners

    @cached_property
    def sandbox_pod(self) -> dict[str, Any] | None:
        """The pod, except once the Session ended when it is not ours: a pod that is not ours
        is never released."""
        pod = self.pod
        if pod is not None and self.ended and ownership(pod, self.name, self.uid) != "ours":
            return None
        return pod

    @cached_property
    def pod_alive(self) -> bool:
        """The pod is there, not being deleted, and not finished: a pod the kubelet evicted
        (node pressure) stays, Failed, until someone deletes it, and serves nothing."""
        pod = self.sandbox_pod
        if pod is None or pod.get("metadata", {}).get("deletionTimestamp"):
            return False
        return (pod.get("status") or {}).get("phase") not in DEAD_POD_PHASES

    @cached_property
    def parsed_agent(self) -> Agent | ValidationError:
        """The Agent's metadata and spec, validated, or why they do not validate."""
        assert self.agent_body is not None, "a missing Agent is decided before it is read"
        body = self.agent_body
        try:
            return Agent.model_validate({k: body.get(k) for k in ("metadata", "spec")})
        except ValidationError as exc:
            return exc

    @property
    def agent(self) -> Agent:
        parsed = self.parsed_agent
        if isinstance(parsed, ValidationError):
            raise parsed
        return parsed

    @cached_property
    def lineage_outcome(self) -> Lineage | LineageRefusal:
        """Where the Session sits in its tree (depth, turns, budget), derived, never read; or
        why its chain refuses it."""
        return derive_lineage(
            self.body, self.agent.spec, self.parents or [], self.ancestor_agents or {}
        )

    @property
    def lineage(self) -> Lineage:
        outcome = self.lineage_outcome
        assert isinstance(outcome, Lineage), "a refused lineage is decided before it is read"
        return outcome

    @cached_property
    def pod_name(self) -> str:
        """The name the sandbox pod gets."""
        return naming.pod_name(self.name)

    @cached_property
    def serving(self) -> bool:
        """Whether the pod is ready and has an IP: the harness serves."""
        return pod_is_ready(self.sandbox_pod)

    @cached_property
    def seen(self) -> SessionStatus:
        """The status with the living pod's name and the children's summary."""
        assert self.sandbox_pod is not None, "a pod that is not alive is decided before"
        name = self.sandbox_pod["metadata"].get("name", self.pod_name)
        status = self.old.model_copy(update={"pod_name": name})
        if self.children is not None:
            status = status.model_copy(update={"children": summarize_children(self.children)})
        return status

    @cached_property
    def pod_ip(self) -> str:
        assert self.sandbox_pod is not None, "read only while the harness serves"
        ip: str = self.sandbox_pod["status"]["podIP"]
        return ip

    @cached_property
    def harness_url(self) -> str:
        return f"http://{self.pod_ip}:{self.settings.harness_port}"
