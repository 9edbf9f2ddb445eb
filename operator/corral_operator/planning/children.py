"""Whether a Session's pass needs the list of its children at all (pure)."""

from __future__ import annotations

from typing import Any


def may_have_children(body: dict[str, Any], agent: dict[str, Any] | None) -> bool:
    """Only an orchestrator's custodian starts children, so any other Session skips the LIST:
    a label-selected LIST reads every Session of the namespace, and one per pass per Session
    made the API server the bottleneck of a 1,000-Session burst (docs/performance.md). A
    Session that already counts children, or waits for them, keeps listing; so does one whose
    Agent is not known."""
    status = body.get("status") or {}
    if status.get("phase") == "WaitingForChildren" or (status.get("children") or {}).get("total"):
        return True
    return agent is None or bool((agent.get("spec") or {}).get("orchestrator"))
