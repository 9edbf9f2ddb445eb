"""Approval: announce it and check it names a real Session; never decide it. A landing
Approval (`land`, `merge`) of a Session with a landing check gets its Evidence started.

The operator holds no right on approvals/status (ADR 0032): whoever may initialise that status
may also decide it. An Approval without status reads as Pending.
"""

from __future__ import annotations

from typing import Any

import kopf

from corral_api import GROUP, VERSION
from corral_api.labels import evidence_selector

from ..kube import corral_path
from ..planning.approval import check_approval, evidence_requested
from ..planning.evidence_request import (
    landing_revision,
    plan_evidence_creation,
    session_needs_agent,
    wanted_for_approval,
)
from ..runtime import Runtime, post_event
from ._common import plain, runtime


@kopf.on.event(GROUP, VERSION, "approvals")
async def approval_event(**kw: Any) -> None:
    # A watch event, not kopf's on.create: that would patch kopf's annotations onto the
    # Approval, and the operator holds no write right on Approvals at all. Type None is the
    # initial listing (a restart): no second announcement, but Evidence is still ensured.
    if kw["type"] not in (None, "ADDED", "MODIFIED"):
        return
    rt, body = runtime(kw["memo"]), plain(kw["body"])
    name = str(((body.get("spec") or {}).get("sessionRef") or {}).get("name") or "")
    session = await rt.kube.get(corral_path("Session", kw["namespace"], name)) if name else None
    if kw["type"] == "ADDED":
        post_event(body, check_approval(body, session))
    if session is not None and landing_revision(body) is not None:
        await _ensure_evidence(rt, body, session)


async def _ensure_evidence(rt: Runtime, approval: dict[str, Any], session: dict[str, Any]) -> None:
    """Create the Evidence the landing Approval calls for, unless it exists already."""
    agent = None
    agent_ref = str((session.get("spec") or {}).get("agentRef") or "")
    if agent_ref and session_needs_agent(session):
        agent = await rt.kube.get(corral_path("Agent", session["metadata"]["namespace"], agent_ref))
    wanted = wanted_for_approval(approval, session, agent)
    if wanted is None:
        return
    selector = evidence_selector(wanted.check.name, wanted.revision, wanted.repo)
    existing = await rt.kube.list(corral_path("Evidence", wanted.namespace), selector)
    manifest = plan_evidence_creation(wanted, existing)
    if manifest is not None and await rt.kube.create(manifest):
        post_event(approval, evidence_requested(manifest))
