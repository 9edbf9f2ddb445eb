"""The observe step of a Session's pass: everything its planner reads, gathered.

The Agent and the pod come as the operator's watches delivered them, else from the API
server; reads that do not depend on each other go out together (under load each is a wait).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from corral_api.freeze import FrozenBy
from corral_api.kinds import FINAL_PHASES, MAX_DEPTH_CAP

from .. import naming
from ..kube import corral_path, object_path
from ..planning.children import may_have_children
from ..planning.session import SessionPlan, plan_session
from ..settings import OperatorSettings
from .context import LoopContext, sandbox_pod_path

_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class Observed:
    """What one pass read: the planner's inputs."""

    body: dict[str, Any]
    agent: dict[str, Any] | None
    pod: dict[str, Any] | None
    children: list[dict[str, Any]] | None = None
    approvals: list[dict[str, Any]] | None = None
    parents: list[dict[str, Any]] = field(default_factory=list)
    ancestor_agents: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    existing: dict[str, dict[str, Any]] = field(default_factory=dict)
    frozen_by: FrozenBy | None = None

    def plan(self, settings: OperatorSettings, now: datetime) -> SessionPlan:
        """The pure planner's answer to what was read."""
        return plan_session(
            self.body,
            self.agent,
            self.pod,
            settings,
            now,
            self.children,
            self.approvals,
            parents=self.parents,
            ancestor_agents=self.ancestor_agents,
            existing=self.existing,
            frozen_by=self.frozen_by,
        )


async def observe(ctx: LoopContext) -> Observed | None:
    """Read what the planner needs; None once the Session is gone or going."""
    body = await ctx.view.read()
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    status = body.get("status") or {}
    ctx.pod_path = sandbox_pod_path(body)
    # A Session not yet planned has no pod unless the watch saw one: a pod in the way
    # shows as a 409 when it is created, and that pass looks everything up.
    unplanned = not status.get("conditions") and not ctx.look_up_existing
    agent_ref = str((body.get("spec") or {}).get("agentRef", ""))
    agent, pod = await asyncio.gather(ctx.read_agent(agent_ref), ctx.read_pod(ask=not unplanned))
    if pod is None and status.get("phase") not in FINAL_PHASES:
        agent = await ctx.read_agent(agent_ref, fresh=True)  # this pass may make the pod
    children = None
    if may_have_children(body, agent):
        children = await ctx.own_children(body["metadata"].get("uid", ""))
    approvals = None
    if status.get("phase") == "WaitingForHuman":
        approvals = await ctx.kube.list(corral_path("Approval", ctx.namespace))
    if status.get("phase") in FINAL_PHASES:
        return Observed(body, agent, pod, children, approvals)
    parents, ancestor_agents = await _ancestors(ctx, body)
    ctx.chain = [body, *parents]
    existing: dict[str, dict[str, Any]] = {}
    if pod is None and not unplanned:
        # A Session past its first pass may have left objects behind (a restart, an
        # earlier Session of this name); a new one creates, and looks only on a 409.
        existing, frozen_by = await asyncio.gather(_existing(ctx), ctx.frozen_by())
    else:
        frozen_by = await ctx.frozen_by()
    return Observed(
        body, agent, pod, children, approvals, parents, ancestor_agents, existing, frozen_by
    )


async def _ancestors(
    ctx: LoopContext, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any] | None]]:
    """The Sessions up the parentRef chain, nearest first, as far as they are found (one
    beyond the depth cap, so a chain too deep is seen), and the Agents they name."""
    parents: list[dict[str, Any]] = []
    seen = {body["metadata"].get("uid")}
    ref = (body.get("spec") or {}).get("parentRef") or {}
    while ref.get("name") and len(parents) <= MAX_DEPTH_CAP:
        name = str(ref["name"])
        if not _OBJECT_NAME.match(name):
            break
        parent = await ctx.kube.get(corral_path("Session", ctx.namespace, name))
        if parent is None:
            break
        parents.append(parent)
        if parent["metadata"].get("uid") in seen:
            break
        seen.add(parent["metadata"].get("uid"))
        ref = (parent.get("spec") or {}).get("parentRef") or {}
    agents: dict[str, dict[str, Any] | None] = {}
    for parent in parents:
        name = str((parent.get("spec") or {}).get("agentRef") or "")
        if name and name not in agents and _OBJECT_NAME.match(name):
            agents[name] = await ctx.kube.get(corral_path("Agent", ctx.namespace, name))
    return parents, agents


async def _existing(ctx: LoopContext) -> dict[str, dict[str, Any]]:
    """The objects already there under the names the sandbox's Secret and policy need."""
    wanted = (
        ("Secret", "v1", naming.wire_secret_name(ctx.name)),
        ("NetworkPolicy", "networking.k8s.io/v1", naming.network_policy_name(ctx.name)),
    )
    objs = await asyncio.gather(
        *(ctx.kube.get(object_path(api, kind, ctx.namespace, name)) for kind, api, name in wanted)
    )
    return {kind: obj for (kind, _, _), obj in zip(wanted, objs, strict=True) if obj is not None}
