"""What a person writes on an Approval when they decide it: the one shape `corral approve` /
`corral deny` and the console both write, and how every reader of an Approval reads it back
(docs/approvals.md)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .timestamps import rfc3339

APPROVED = "Approved"
DENIED = "Denied"
PENDING = "Pending"  # an Approval without a decision (no status yet, or none written)
DECISIONS = (APPROVED, DENIED)
# The local approval files' verdicts (corral_common.approval_files) as Approval decisions.
_FILE_VERDICTS = {"approved": APPROVED, "denied": DENIED}


def approval_decision(approval: Mapping[str, Any]) -> str:
    """`Approved`, `Denied`, or `Pending` while the Approval carries no decision."""
    return str((approval.get("status") or {}).get("decision") or PENDING)


def decision_of_verdict(verdict: object) -> str:
    """A local approval file's verdict (`approved`, `denied`, none) as an Approval decision."""
    return _FILE_VERDICTS.get(str(verdict), PENDING)


def approval_action(approval: Mapping[str, Any]) -> str:
    """The exact call an Approval names, as one line: the tool, then its arguments."""
    action = (approval.get("spec") or {}).get("action") or {}
    return f"{action.get('tool', '?')} {action.get('arguments', '{}')}"


def approval_session(approval: Mapping[str, Any]) -> str:
    """The name of the Session that asked."""
    return str(((approval.get("spec") or {}).get("sessionRef") or {}).get("name", ""))


def decision_status(decision: str, user: str, comment: str, now: datetime) -> dict[str, Any]:
    """The status: the decision (`Approved` or `Denied`), who made it, when, and why."""
    status: dict[str, Any] = {
        "decision": decision,
        "decidedBy": user,
        "decidedAt": rfc3339(now),
    }
    if comment:
        status["comment"] = comment
    return status


def decision_patch(
    approval: Mapping[str, Any], decision: str, user: str, comment: str, now: datetime
) -> dict[str, Any]:
    """The merge patch of the status subresource that writes a decision: a compare-and-swap on
    the Approval's resourceVersion, so a decision someone wrote meanwhile is not overwritten
    (and a decision is final anyway: the schema's CEL rule)."""
    return {
        "metadata": {"resourceVersion": approval["metadata"]["resourceVersion"]},
        "status": decision_status(decision, user, comment, now),
    }
