"""Agent: validate it, keep its Ready condition, and wake the Sessions that wait on it."""

from __future__ import annotations

from typing import Any

import kopf

from corral_api import GROUP, VERSION

from ..kube import corral_path
from ..planning.agent import plan_agent
from ..planning.patch import merge_patch
from ..planning.session import PlannedEvent, now_text
from ..runtime import post_event
from ._common import namespace_of, now, plain, runtime


@kopf.on.event(GROUP, VERSION, "agents")
async def agent_changed(
    type: str | None,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    rt = runtime(memo)
    namespace = namespace_of(namespace)
    gone = type == "DELETED"
    rt.agents.saw(namespace, name, None if gone else plain(body))
    if not gone:
        current = plain(body)
        plan = plan_agent(current, now_text(now()))
        if plan.changed:
            patch = merge_patch(current.get("status") or {}, plan.status)
            await rt.kube.patch_status(corral_path("Agent", namespace, name), patch)
            post_event(
                current,
                PlannedEvent("Normal" if plan.ready else "Warning", plan.reason, plan.message),
            )
    # Sessions read their Agent afresh: a Session waiting for this Agent looks again now.
    rt.wake_namespace(namespace)
