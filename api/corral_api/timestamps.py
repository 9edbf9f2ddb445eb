"""Timestamps as Kubernetes writes them in status: RFC 3339, UTC, whole seconds."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> datetime | None:
    """The moment `text` names, or None when it is missing or not a timestamp."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
