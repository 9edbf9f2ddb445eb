"""Approval: whether it binds to a live Session (same namespace, name and uid), and what the
operator says when a landing Approval starts an Evidence."""

from __future__ import annotations

from typing import Any

from corral_api.decisions import DECISIONS, approval_decision

from .session import PlannedEvent


def check_approval(approval: dict[str, Any], session: dict[str, Any] | None) -> PlannedEvent:
    spec = approval.get("spec") or {}
    ref = spec.get("sessionRef") or {}
    tool = (spec.get("action") or {}).get("tool", "?")
    if session is None:
        return PlannedEvent(
            "Warning", "SessionNotFound", f"Session {ref.get('name')!r} does not exist here"
        )
    uid = session.get("metadata", {}).get("uid")
    if ref.get("uid") != uid:
        return PlannedEvent(
            "Warning",
            "SessionMismatch",
            f"sessionRef.uid {ref.get('uid')!r} is not Session {ref.get('name')!r} ({uid})",
        )
    return PlannedEvent(
        "Normal",
        "ApprovalRequested",
        f"Session {ref.get('name')} asks to run {tool}; decide with `corral approve "
        f"{approval.get('metadata', {}).get('name')}` or `corral deny ... --reason TEXT`",
    )


def evidence_requested(evidence: dict[str, Any]) -> PlannedEvent:
    """The Event on a landing Approval whose Evidence the operator has just created."""
    spec = evidence.get("spec") or {}
    return PlannedEvent(
        "Normal",
        "EvidenceRequested",
        f"Evidence {evidence.get('metadata', {}).get('name')} runs check {spec.get('check')!r} "
        f"at {str(spec.get('revision', ''))[:12]}; land needs its Pass",
    )


def requested_on_session(approval: dict[str, Any]) -> PlannedEvent:
    """The Event on the Session whose call waits for `approval` (it binds: checked first)."""
    spec = approval.get("spec") or {}
    tool = (spec.get("action") or {}).get("tool", "?")
    name = approval.get("metadata", {}).get("name")
    why = f": {spec['reason']}" if spec.get("reason") else ""
    return PlannedEvent(
        "Normal", "ApprovalRequested", f"Approval {name} asks a person to allow {tool}{why}"[:1000]
    )


def decided_on_session(approval: dict[str, Any]) -> PlannedEvent | None:
    """The Event on the Session once a person decided `approval`; None while it is pending."""
    status = approval.get("status") or {}
    decision = approval_decision(approval)
    if decision not in DECISIONS:
        return None
    tool = ((approval.get("spec") or {}).get("action") or {}).get("tool", "?")
    name = approval.get("metadata", {}).get("name")
    text = f"Approval {name} for {tool}: {decision} by {status.get('decidedBy') or 'unknown'}"
    if status.get("comment"):
        text += f" ({status['comment']})"
    return PlannedEvent(
        "Normal" if decision == "Approved" else "Warning", f"Approval{decision}", text[:1000]
    )
