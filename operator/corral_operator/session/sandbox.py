"""The sandbox step of a Session's pass: its Secret and NetworkPolicy, then its pod, a warm
pool's (adopted) or a cold one (created), when the plan asks for them.

An object that exists already is used only if this Session controls it; otherwise the pod is
not created (a pod must never mount a Secret someone else wrote, nor run before its policy)
and the next pass fails the Session naming the object.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from corral_api.kinds import Agent, Session, SessionStatus
from corral_kube import Conflict, KubeRefused

from ..builders.podbuilder import (
    EGRESS_CREDENTIAL_KEY,
    ResumePoint,
    SandboxManifests,
    build_sandbox,
    carved_for,
)
from ..kube import object_path
from ..planning.lineage import Lineage
from ..planning.session import PlannedEvent, SessionPlan, ownership, with_sandbox_refused
from ..runtime import post_event
from .adoption import adopt_pooled_pod
from .context import LoopContext


@dataclass(frozen=True)
class SandboxStarted:
    """The planned status as the step leaves it (an adopted pod's name, or the refusal), the
    warm pod adopted, and the refusal the pass raises once its status is written."""

    status: dict[str, Any]
    adopted: str | None = None
    refused: KubeRefused | None = None


async def start_sandbox(
    ctx: LoopContext, body: dict[str, Any], agent: dict[str, Any] | None, plan: SessionPlan
) -> SandboxStarted:
    """Create the sandbox when the plan says so; what it did."""
    if not plan.create_sandbox or agent is None or plan.lineage is None:
        return SandboxStarted(plan.status)
    try:
        adopted = await create_sandbox(ctx, body, agent, plan.lineage)
    except KubeRefused as err:  # unreachable is no refusal: the pass fails and is retried
        generation = int(body["metadata"].get("generation") or 0)
        refused = with_sandbox_refused(
            plan.status, err.message, now=datetime.now(UTC), generation=generation
        )
        return SandboxStarted(refused, refused=err)
    if adopted is None:
        return SandboxStarted(plan.status)
    post_event(body, PlannedEvent("Normal", "SandboxAdopted", f"adopted the warm pod {adopted}"))
    return SandboxStarted({**plan.status, "podName": adopted}, adopted=adopted)


async def create_sandbox(
    ctx: LoopContext, body: dict[str, Any], agent: dict[str, Any], lineage: Lineage
) -> str | None:
    """Create the Secret and the policy (together), then the pod. Once the Secret and the
    policy are there, a pod of the Agent's warm pool is adopted instead of creating one when
    there is one: its name."""
    rt = ctx.rt
    session = Session.model_validate({k: body[k] for k in ("metadata", "spec")})
    the_agent = Agent.model_validate({k: agent[k] for k in ("metadata", "spec")})
    wire_token, credential = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    egress_credential = secrets.token_urlsafe(32)  # the custodian's, for the egress gateway

    children: list[dict[str, Any]] = []
    status = body.get("status") or {}
    if status.get("restarts") or status.get("suspensions"):  # resumed: what it gave them
        children = await ctx.own_children(str(body["metadata"].get("uid", "")))
    resume = resume_point(body, children)

    def build(egress: str) -> SandboxManifests:
        return build_sandbox(
            the_agent,
            session,
            rt.settings,
            wire_token,
            credential,
            budget=lineage.budget,
            egress_credential=egress,
            resume=resume,
        )

    manifests = build(egress_credential)
    uid = str(body["metadata"].get("uid", ""))
    secret_created, _ = await asyncio.gather(
        create_ours(ctx, manifests.secret, uid),
        create_ours(ctx, manifests.network_policy, uid),
    )
    if secret_created:
        rt.wire_tokens[(ctx.namespace, ctx.name)] = (uid, wire_token)
    elif rt.settings.egress_gateway is not None:
        # A Secret of an earlier pass (the pod went, or the operator restarted): the pod's
        # binding must name the credential that Secret holds, not a new one.
        kept = await _kept_egress_credential(ctx, manifests.secret)
        if kept is not None and kept != egress_credential:
            egress_credential = kept
            manifests = build(kept)
    # A warm pod is checked out at the starting ref with a fresh record: never a resumed one's.
    adopted = None
    if resume is None:
        adopted = await adopt_pooled_pod(
            rt, the_agent, session, wire_token, credential, lineage.budget, egress_credential
        )
    if adopted is not None:
        rt.metrics.pods_started.labels(ctx.namespace, "warm").inc()
        return adopted
    if await create_ours(ctx, manifests.pod, uid, remember=True):
        rt.metrics.pods_started.labels(ctx.namespace, "cold").inc()
    return None


def resume_point(
    body: dict[str, Any], children: Iterable[dict[str, Any]] = ()
) -> ResumePoint | None:
    """Where a Session that lost its pod (or was suspended) resumes: its delivered revision,
    its usage and what its custodian had carved for `children` (its own child Sessions)."""
    status = SessionStatus.model_validate(body.get("status") or {})
    if not status.restores_conversation:
        return None
    revision = status.delivery.revision if status.delivery is not None else None
    tokens, cost = carved_for(children)
    return ResumePoint(
        revision=revision, usage=status.usage, carved_tokens=tokens, carved_cost=cost
    )


async def _kept_egress_credential(ctx: LoopContext, secret: dict[str, Any]) -> str | None:
    md = secret["metadata"]
    there = await ctx.kube.get(object_path("v1", "Secret", md["namespace"], md["name"]))
    value = ((there or {}).get("data") or {}).get(EGRESS_CREDENTIAL_KEY)
    return base64.b64decode(value).decode() if value else None


async def create_ours(
    ctx: LoopContext, manifest: dict[str, Any], uid: str, *, remember: bool = False
) -> bool:
    """Create `manifest`: True when created, False when this Session's own is there already
    (a restart); Conflict (409) when someone else's is in the way. A `remember`ed pod is kept
    as created, so its ADDED event changes nothing and wakes no pass (that pass had nothing
    to do, and read the Session back while the watch lagged)."""
    if remember:
        created = await ctx.kube.create_object(manifest)
        if created is not None:
            ctx.rt.pods.saw(ctx.namespace, manifest["metadata"]["name"], created)
            return True
    elif await ctx.kube.create(manifest):
        return True
    md = manifest["metadata"]
    path = object_path(manifest["apiVersion"], manifest["kind"], md["namespace"], md["name"])
    there = await ctx.kube.get(path)
    if there is None or ownership(there, ctx.name, uid) != "ours":
        ctx.look_up_existing = True  # the next pass plans with what is in the way
        what = f"{manifest['kind']} {md['name']}"
        raise Conflict(409, f"{what} exists and is not this Session's")
    return False
