"""Timestamps as Kubernetes writes them in status: RFC 3339, UTC, whole seconds."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_rfc3339() -> str:
    return rfc3339(datetime.now(UTC))


def parse_rfc3339(text: str | None) -> datetime | None:
    """The moment `text` names, or None when it is missing or not a timestamp."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def age(timestamp: str | None, now: float, unknown: str = "") -> str:
    """kubectl's AGE of an object's timestamp (45s, 3m, 2h, 4d); `unknown` when it has none."""
    then = parse_rfc3339(timestamp)
    if then is None:
        return unknown
    seconds = max(0, int(now - then.timestamp()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
