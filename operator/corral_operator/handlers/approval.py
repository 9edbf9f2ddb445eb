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
from ..planning.approval import (
    check_approval,
    decided_on_session,
    evidence_requested,
    requested_on_session,
)
from ..planning.evidence_request import (
    landing_revision,
    plan_evidence_creation,
    session_needs_agent,
    wanted_for_approval,
)
from ..runtime import Runtime, post_event
from ._common import namespace_of, plain, runtime


@kopf.on.event(GROUP, VERSION, "approvals")
async def approval_event(
    type: str | None,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    # A watch event, not kopf's on.create: that would patch kopf's annotations onto the
    # Approval, and the operator holds no write right on Approvals at all. Type None is the
    # initial listing (a restart): no second announcement, but Evidence is still ensured.
    rt = runtime(memo)
    if namespace:  # the pending-approvals gauge (docs/observability.md)
        gone = type == "DELETED"
        rt.metrics.approval_seen(namespace, name, None if gone else plain(body))
    if type not in (None, "ADDED", "MODIFIED"):
        return
    approval = plain(body)
    session_name = str(((approval.get("spec") or {}).get("sessionRef") or {}).get("name") or "")
    session: dict[str, Any] | None = None
    if session_name:
        path = corral_path("Session", namespace_of(namespace), session_name)
        session = await rt.kube.get(path)
    if type == "ADDED":
        announced = check_approval(approval, session)
        post_event(approval, announced)
        if session is not None and announced.reason == "ApprovalRequested":
            post_event(session, requested_on_session(approval))  # `kubectl describe session`
    _announce_decision(approval, session, quiet=type is None)
    if session is not None and landing_revision(approval) is not None:
        await _ensure_evidence(rt, approval, session)


# Approvals (by uid) whose decision this process has told their Session: a decision is final,
# so once each; one seen decided in the initial listing was told by an earlier process.
_DECIDED: set[str] = set()


def _announce_decision(
    approval: dict[str, Any], session: dict[str, Any] | None, *, quiet: bool
) -> None:
    uid = str(approval.get("metadata", {}).get("uid") or "")
    decided = decided_on_session(approval)
    if decided is None or not uid or uid in _DECIDED:
        return
    _DECIDED.add(uid)
    ref = (approval.get("spec") or {}).get("sessionRef") or {}
    binds = session is not None and ref.get("uid") == session.get("metadata", {}).get("uid")
    if binds and not quiet:
        assert session is not None
        post_event(session, decided)


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
