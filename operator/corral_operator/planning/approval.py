"""Approval: whether it binds to a live Session (same namespace, name and uid), and what the
operator says when a landing Approval starts an Evidence."""

from __future__ import annotations

from typing import Any

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
        f"Session {ref.get('name')} asks to run {tool}; decide with `kubectl edit "
        f"approval {approval.get('metadata', {}).get('name')} --subresource=status`",
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
