"""The release step of a Session's pass: once its history is archived, the sandbox pod the
plan releases is deleted, and the Session itself once its TTL has passed."""

from __future__ import annotations

from typing import Any

from ..planning.session import PlannedEvent, SessionPlan
from ..runtime import post_event
from .archiving import archive_first
from .context import LoopContext


async def release(
    ctx: LoopContext, body: dict[str, Any], status: dict[str, Any], plan: SessionPlan
) -> float | None:
    """Delete what the plan releases, archived first; the seconds until the archive is tried
    again (while the pod waits for it), else None. A dead pod is deleted at once: it serves
    nothing to archive from."""
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
