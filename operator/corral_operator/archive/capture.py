"""Archiving a Session from its harness: the whole wire history, then the record beside it.

The history is read with the operator's cap (`--max-history-bytes`): a history larger than
that is not archived, the record and the final status are, and the record says why
(`historyOmitted`); the caller reports it on the Session's `Archived` condition.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from corral_api.timestamps import now_rfc3339

from ..driver import AnswerTooLarge, ConversationLost
from ..wireclient import DEFAULT_MAX_ANSWER_BYTES, WireClient
from .record import build_record
from .store import ArchiveStore

# One try may take this long (the history of a long session is a few MB at most); the loop
# retries until the Session's archive deadline and then lets the pod go (docs/history.md).
ARCHIVE_TRY_SECONDS = 15.0


@dataclass(frozen=True)
class Captured:
    """What was archived: how many events, and why the transcript was left out (or None)."""

    events: int
    omitted: str | None = None


async def archive_from_harness(
    store: ArchiveStore,
    session: dict[str, Any],
    harness_url: str | None,
    token: str,
    *,
    cause: str,
    transport: httpx.AsyncBaseTransport | None = None,
    max_history_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> Captured:
    """Read the Session's conversation from its harness (None: there is no pod) and archive it
    with the Session as it is now. Raises on any failure but a history over the cap (nothing
    is half-written)."""
    md = session["metadata"]
    agent = str((session.get("spec") or {}).get("agentRef", ""))
    events: list[dict[str, Any]] = []
    omitted: str | None = None
    # No pod (never made, or lost): the record alone says how the Session ended.
    if harness_url is not None:
        async with WireClient(
            harness_url, agent, token=token, transport=transport, max_answer_bytes=max_history_bytes
        ) as client:
            try:
                history = await asyncio.wait_for(client.history(md["name"]), ARCHIVE_TRY_SECONDS)
                events = list(history.events)
            except ConversationLost:  # no turn was ever admitted: the record alone says why
                pass
            except AnswerTooLarge as too_large:  # a retry would read as much again
                omitted = str(too_large)
    stamp = now_rfc3339()
    record = build_record(session, events, archived_at=stamp, cause=cause)
    if omitted is not None:
        record["historyOmitted"] = omitted
    # File writes go to a thread: a slow volume must not stall every Session's loop.
    await asyncio.to_thread(store.write, md["namespace"], md["name"], md["uid"], record, events)
    return Captured(len(events), omitted)
