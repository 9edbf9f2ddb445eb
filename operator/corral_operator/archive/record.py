"""The archive's record of one Session: pure data, built from the wire's history and the
Session object (docs/history.md describes the format)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ARCHIVE_FORMAT = "corral.dev/archive/v1"
# What of the Session's metadata the record keeps: enough to find and audit it, no managed
# fields or kopf bookkeeping.
_METADATA_KEYS = ("name", "namespace", "uid", "labels", "creationTimestamp", "generation")


def receipts_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per settled submission, in order: its status, error, usage and receipt."""
    found: list[dict[str, Any]] = []
    for event in events:
        if event.get("type") != "settled":
            continue
        entry: dict[str, Any] = {
            "settlement": len(found) + 1,
            "offset": event.get("offset"),
            "submissionId": event.get("submissionId"),
            "status": event.get("status"),
        }
        for key in ("error", "usage", "receipt", "plan", "question"):
            if event.get(key) is not None:
                entry[key] = event[key]
        found.append(entry)
    return found


def build_record(
    session: dict[str, Any], events: list[dict[str, Any]], *, archived_at: str, cause: str
) -> dict[str, Any]:
    """record.json: the Session as it ended, its receipts, and how many events were kept."""
    md = session.get("metadata") or {}
    return {
        "format": ARCHIVE_FORMAT,
        "archivedAt": archived_at,
        "cause": cause,
        "events": len(events),
        "receipts": receipts_of(events),
        "session": {
            "apiVersion": session.get("apiVersion"),
            "kind": session.get("kind"),
            "metadata": {k: md[k] for k in _METADATA_KEYS if k in md},
            "spec": session.get("spec") or {},
            "status": session.get("status") or {},
        },
    }


@dataclass(frozen=True)
class ArchivedSession:
    """One archived Session as read back: its record and its transcript."""

    record: dict[str, Any]
    events: list[dict[str, Any]]

    @property
    def uid(self) -> str:
        return str(self.record["session"]["metadata"].get("uid", ""))

    @property
    def session(self) -> dict[str, Any]:
        """The Session as it ended, as the record keeps it (apiVersion, kind, metadata, spec,
        status): what a reader shows once the Session object itself is gone."""
        return dict(self.record.get("session") or {})

    def events_from(self, offset: int) -> list[dict[str, Any]]:
        """The transcript from `offset` on: the wire's offsets, as the live harness serves
        them, so a reader follows a Session across its pod's end without a seam."""
        return [e for e in self.events if int(e.get("offset", 0)) >= offset]
