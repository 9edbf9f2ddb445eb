"""The release step of a Session's pass: once its history is archived, the sandbox pod the
plan releases is deleted, and the Session itself once its TTL has passed."""

from __future__ import annotations

import logging
from typing import Any

import httpx

from ..driver import WireFault
from ..planning.session import PlannedEvent, SessionPlan
from ..runtime import post_event
from ..wireclient import WireClient
from .archiving import archive_first
from .context import LoopContext
from .continuity import LogArchiver, Run
from .wiretoken import read_wire_token

log = logging.getLogger("corral.operator.session")

# A suspended Session's pod whose log could not be read yet is tried again this soon.
SUSPEND_RETRY_SECONDS = 2.0


async def release(
    ctx: LoopContext, body: dict[str, Any], status: dict[str, Any], plan: SessionPlan
) -> float | None:
    """Delete what the plan releases, archived first; the seconds until the archive is tried
    again (while the pod waits for it), else None. A dead pod is deleted at once: it serves
    nothing to archive from."""
    if plan.suspend_pod:
        return await release_suspended(ctx, body, plan)
    if plan.discard_pod:
        if await ctx.kube.delete(ctx.pod_path):
            text = "the dead sandbox pod is deleted to make way for a new one"
            post_event(body, PlannedEvent("Normal", "SandboxReleased", text))
        return None
    if not (plan.delete_pod or plan.delete_session):
        return None
    archived = await archive_first(ctx, body, status, "ttl" if plan.delete_session else "finished")
    if not archived.release:
        return archived.retry_after  # the pod waits for its archive; retried shortly
    if plan.delete_pod and await ctx.kube.delete(ctx.pod_path):
        post_event(body, PlannedEvent("Normal", "SandboxReleased", "the sandbox pod is deleted"))
    if plan.delete_session:
        await ctx.kube.delete(ctx.path)
    return archived.retry_after


async def release_suspended(ctx: LoopContext, body: dict[str, Any], plan: SessionPlan) -> (
    float | None
):  # fmt: skip
    """A suspended Session's pod goes once the archive holds its whole conversation log (read
    from the serving harness); until then it stays, and this is tried again shortly."""
    store = ctx.rt.archive
    if store is not None and plan.pod_ip is not None:
        uid = str(body["metadata"].get("uid", ""))
        settings = ctx.rt.settings
        token = await read_wire_token(ctx.kube, ctx.namespace, ctx.name, uid, ctx.rt.wire_tokens)
        client = WireClient(
            f"http://{plan.pod_ip}:{settings.harness_port}",
            str(body["spec"]["agentRef"]),
            token=token,
            transport=ctx.rt.wire_transport,
            max_answer_bytes=settings.max_history_bytes,
        )
        try:
            await LogArchiver(store, Run(ctx.namespace, ctx.name, uid), client).catch_up()
        except (WireFault, OSError, ValueError, httpx.HTTPError) as err:
            log.warning("session %s/%s: log not archived, the pod stays: %s",
                        ctx.namespace, ctx.name, err)  # fmt: skip
            return SUSPEND_RETRY_SECONDS
        finally:
            await client.aclose()
    if await ctx.kube.delete(ctx.pod_path):
        text = "suspended: the conversation is archived and the sandbox pod deleted"
        post_event(body, PlannedEvent("Normal", "SandboxReleased", text))
    return None
