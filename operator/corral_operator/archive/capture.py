"""Archiving a Session from its harness: the whole wire history, then the record beside it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx

from ..driver import ConversationLost
from ..wireclient import WireClient
from .record import build_record
from .store import ArchiveStore

# One try may take this long (the history of a long session is a few MB at most); the loop
# retries until the Session's archive deadline and then lets the pod go (docs/history.md).
ARCHIVE_TRY_SECONDS = 15.0


async def archive_from_harness(
    store: ArchiveStore,
    session: dict[str, Any],
    harness_url: str | None,
    token: str,
    *,
    cause: str,
    transport: httpx.AsyncBaseTransport | None = None,
) -> int:
    """Read the Session's conversation from its harness (None: there is no pod) and archive it
    with the Session as it is now; the number of events archived. Raises on any failure
    (nothing is half-written)."""
    md = session["metadata"]
    agent = str((session.get("spec") or {}).get("agentRef", ""))
    events: list[dict[str, Any]] = []
    # No pod (never made, or lost): the record alone says how the Session ended.
    if harness_url is not None:
        async with WireClient(harness_url, agent, token=token, transport=transport) as client:
            try:
                history = await asyncio.wait_for(client.history(md["name"]), ARCHIVE_TRY_SECONDS)
                events = list(history.events)
            except ConversationLost:  # no turn was ever admitted: the record alone says why
                pass
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    record = build_record(session, events, archived_at=stamp, cause=cause)
    # File writes go to a thread: a slow volume must not stall every Session's loop.
    await asyncio.to_thread(store.write, md["namespace"], md["name"], md["uid"], record, events)
    return len(events)
