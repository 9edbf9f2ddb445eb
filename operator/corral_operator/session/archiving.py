"""The archive step of a Session's pass: its history archived before its pod (or the Session
itself) goes, bounded in time (docs/history.md, `archive.release`)."""

from __future__ import annotations

from typing import Any

from ..archive.release import Release, archive_before_release, archived_already
from ..runtime import post_event
from .context import LoopContext
from .wiretoken import read_wire_token


async def archive_first(
    ctx: LoopContext, body: dict[str, Any], status: dict[str, Any], cause: str
) -> Release:
    """Archive the Session, unless the archive is off or was written (or given up on) already;
    the `Archived` condition and its Event are written here. Its `release`: may the pod go."""
    store = ctx.rt.archive
    if store is None or archived_already(status):
        return Release(release=True)
    settings = ctx.rt.settings
    uid = str(body["metadata"].get("uid", ""))
    done = await archive_before_release(
        ctx.kube,
        store,
        body,
        status,
        ctx.pod_path,
        lambda: read_wire_token(ctx.kube, ctx.namespace, ctx.name, uid, ctx.rt.wire_tokens),
        harness_port=settings.harness_port,
        deadline_seconds=settings.archive_deadline_seconds,
        cause=cause,
        transport=ctx.rt.wire_transport,
        max_history_bytes=settings.max_history_bytes,
    )
    if done.status is not None:
        await ctx.view.patch_status(done.status)
    if done.event is not None:
        post_event(body, done.event)
    return done
