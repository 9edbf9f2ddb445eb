"""The warm pool's decisions: how many pooled pods to start or remove for an Agent, which one
a Session adopts, and whether a Session may adopt one at all (docs/warm-pool.md).

Pure: the handler lists the Agent's pooled pods, asks, and applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral_api.kinds import Agent, Session

from .. import naming
from ..naming import ANNOTATION_DIGEST, COMPONENT_POOL
from ..sandboxspec import WORKSPACE_MOUNT
from .session import pod_is_ready

_DONE_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PoolPlan:
    """What to do to the Agent's pool now."""

    create: int = 0
    delete: list[str] = field(default_factory=list)
    # Why each deletion, for the Events and the log (pod name -> reason).
    reasons: dict[str, str] = field(default_factory=dict)


def pool_size(agent_body: dict[str, Any] | None) -> int:
    """The pool size the Agent asks for; 0 for an Agent that is gone, going or not valid."""
    if not agent_body or agent_body.get("metadata", {}).get("deletionTimestamp"):
        return 0
    conditions = (agent_body.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
        return 0
    warm = ((agent_body.get("spec") or {}).get("sandbox") or {}).get("warmPool") or {}
    return max(0, int(warm.get("size") or 0))


def _pooled(pod: dict[str, Any]) -> bool:
    """Still in the pool: not adopted (adoption relabels it), not going, not finished."""
    md = pod.get("metadata") or {}
    if (md.get("labels") or {}).get(naming.LABEL_COMPONENT) != COMPONENT_POOL:
        return False
    if md.get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in _DONE_PHASES


def _created(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def plan_pool(size: int, digest: str, pods: list[dict[str, Any]]) -> PoolPlan:
    """Keep `size` pooled pods built from `digest`.

    `pods` are the pods labelled as this Agent's pool (adopted ones included: they are
    ignored). Finished pods and pods of another digest (the Agent or the image changed) are
    removed and replaced; a surplus goes newest first, pods not yet ready before ready ones.
    """
    delete: list[str] = []
    reasons: dict[str, str] = {}
    fresh: list[dict[str, Any]] = []
    for pod in pods:
        md = pod.get("metadata") or {}
        name = str(md.get("name"))
        labels = md.get("labels") or {}
        phase = (pod.get("status") or {}).get("phase")
        if labels.get(naming.LABEL_COMPONENT) != COMPONENT_POOL or md.get("deletionTimestamp"):
            continue
        if phase in _DONE_PHASES:
            delete.append(name)
            reasons[name] = f"the pooled pod {phase.lower()}"
        elif (md.get("annotations") or {}).get(ANNOTATION_DIGEST) != digest:
            delete.append(name)
            reasons[name] = "the Agent changed: the pooled pod is stale"
        else:
            fresh.append(pod)
    surplus = len(fresh) - size
    if surplus > 0:
        # Newest first, then unready before ready: the pods that cost least to lose.
        fresh.sort(key=_created, reverse=True)
        fresh.sort(key=pod_is_ready)
        for pod in fresh[:surplus]:
            name = str(pod["metadata"]["name"])
            delete.append(name)
            reasons[name] = "the pool is larger than the Agent asks"
    return PoolPlan(create=max(0, -surplus), delete=delete, reasons=reasons)


def adoptable(pods: list[dict[str, Any]], digest: str) -> list[dict[str, Any]]:
    """Pooled pods a Session may adopt now, oldest first: ready, of the current digest."""
    ready = [
        p
        for p in pods
        if _pooled(p)
        and pod_is_ready(p)
        and ((p.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_DIGEST) == digest
    ]
    return sorted(ready, key=_created)


def warm_refusal(agent: Agent, session: Session) -> str | None:
    """Why this Session must have a cold pod, or None when it may adopt a pooled one."""
    warm = agent.spec.sandbox.warm_pool
    if warm is None or warm.size == 0:
        return "the Agent keeps no warm pool"
    if session.spec.workspace.granted_root != WORKSPACE_MOUNT:
        return f"pooled pods serve the granted root {WORKSPACE_MOUNT} only"
    if agent.spec.credentials.git_secret_ref is not None:
        return "pooled pods check out without git credentials"
    return None


def claim_patch(
    pod: dict[str, Any],
    session_labels: dict[str, str],
    owner: dict[str, Any],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The merge patch that makes a pooled pod the Session's: its labels (so the Session's
    NetworkPolicy selects it and the pool's no longer does), its controller and, behind the
    egress gateway, its binding. The pod's resourceVersion makes it a compare-and-swap: two
    Sessions cannot claim the same pod."""
    md = pod["metadata"]
    labels = {**(md.get("labels") or {}), **session_labels}
    patch: dict[str, Any] = {
        "metadata": {
            "resourceVersion": md["resourceVersion"],
            "labels": labels,
            "ownerReferences": [owner],
        }
    }
    if annotations:
        patch["metadata"]["annotations"] = dict(annotations)
    return patch
