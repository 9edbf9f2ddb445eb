"""What a person writes on an Approval when they decide it: the one shape `corral approve` /
`corral deny` and the console both write (docs/approvals.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def decision_status(decision: str, user: str, comment: str, now: datetime) -> dict[str, Any]:
    """The status: the decision (`Approved` or `Denied`), who made it, when, and why."""
    status: dict[str, Any] = {
        "decision": decision,
        "decidedBy": user,
        "decidedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if comment:
        status["comment"] = comment
    return status
