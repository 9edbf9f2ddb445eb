"""A Session that outlives its pod (docs/turns.md, "A lost pod").

With an archive configured, the harness's durable conversation log is archived as it grows:
after every turn's admission and settlement the records the archive lacks are read over the
wire (`GET .../log?from=N`) and written as one chunk. When the pod is lost, the planner
resumes the Session in a new pod (`pod_lost`), and before its driver runs, `restore` sends
the archived records to the new harness (`PUT .../log`): the turn that was in flight settles
`failed` with `sandbox_lost` there, and the driver admits it again once, with a note.

A turn whose admission never reached the archive (the pod went in between) is not in the
restored log: `restore` says so, and the status records it as lost the same way, so the driver
admits it again all the same.

The work in progress goes the same way (`WipKeeper`): while a turn is in flight the operator
asks the harness every `Agent.spec.workspace.wipIntervalSeconds` for a bundle of the worktree
beyond the delivered revision and keeps the newest in the archive (never on the remote); each
settlement drops it, since the turn's delivery holds that work. The new pod gets it back after
the conversation (`restore_wip`), laid over the checkout only if that is the bundle's base.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from corral_api.kinds import SessionStatus, SettlementRecord
from corral_api.timestamps import now_rfc3339

from ..archive.store import ArchiveStore
from ..driver import WireFault
from ..wireclient import WireClient, WorkInProgress

log = logging.getLogger("corral.operator.continuity")

LOST_BEFORE_ARCHIVED = (
    "sandbox_lost: the sandbox pod was lost before this turn's admission reached the archive"
)


@dataclass(frozen=True)
class Run:
    """One Session's run in the archive: its names and uid."""

    namespace: str
    name: str
    uid: str


class LogArchiver:
    """Keeps the archive's copy of one conversation's log up to date, one catch-up at a time."""

    def __init__(self, store: ArchiveStore, run: Run, client: WireClient) -> None:
        self._store, self._run, self._client = store, run, client
        self._next: int | None = None  # the first record the archive lacks, once known
        self._lock = asyncio.Lock()

    async def catch_up(self) -> int:
        """Archive the records written since the last catch-up; how many."""
        run = self._run
        async with self._lock:
            if self._next is None:  # a new pass's first catch-up: the chunks' names say
                start = await asyncio.to_thread(
                    self._store.log_end, run.namespace, run.name, run.uid
                )
            else:
                start = self._next
            data, after = await self._client.read_log(run.name, start)
            if after > start:
                await asyncio.to_thread(
                    self._store.write_log, run.namespace, run.name, run.uid, start, after, data
                )
            self._next = reached = max(after, start)
            return reached - start


async def restore(store: ArchiveStore, run: Run, client: WireClient, status: SessionStatus) -> (
    SessionStatus | None
):  # fmt: skip
    """Rebuild the conversation in a resumed Session's new harness from the archive; the status
    to write when the turn in flight is not in what was archived (None: nothing to write)."""
    records, count = await asyncio.to_thread(store.read_log, run.namespace, run.name, run.uid)
    if count:
        restored = await client.restore_log(run.name, records)
        if restored is not None:
            log.info(
                "%s/%s: conversation restored in the new pod (%d records, %d events; "
                "interrupted: %s)", run.namespace, run.name, restored.records, restored.events,
                ", ".join(restored.interrupted) or "none",
            )  # fmt: skip
    ledger = status.ledger
    if ledger is None or _admitted_in(records, ledger.submission_id):
        return None
    # Its admission was never archived: the new harness cannot know it. Recorded as lost, so
    # the driver admits it again under its next resume key.
    return status.model_copy(
        update={
            "ledger": None,
            "last_settlement": SettlementRecord(
                submission_id=ledger.submission_id,
                status="failed",
                error=LOST_BEFORE_ARCHIVED,
                turn=ledger.turn,
            ),
            "resume_interruptions": status.resume_interruptions + 1,
        }
    )


def _admitted_in(records: bytes, submission_id: str) -> bool:
    """Whether the log's records hold the admission of `submission_id`."""
    needle = submission_id.encode()
    for line in records.splitlines():
        if needle not in line:
            continue
        try:
            record: Any = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(record, dict)
            and record.get("k") == "sub"
            and record.get("id") == submission_id
        ):
            return True
    return False


class WipKeeper:
    """Keeps the newest work in progress of one Session's turn in flight in the archive."""

    def __init__(self, store: ArchiveStore, run: Run, client: WireClient) -> None:
        self._store, self._run, self._client = store, run, client
        self._lock = asyncio.Lock()  # a save and a settlement's drop never interleave

    async def keep(self, interval: float, in_flight: Callable[[], bool]) -> None:
        """Save every `interval` seconds while `in_flight()`; runs until cancelled. A save that
        fails is logged, and the next one tries again."""
        while True:
            await asyncio.sleep(interval)
            if not in_flight():
                continue
            try:
                await self.save()
            except (WireFault, OSError, ValueError, httpx.HTTPError) as err:
                run = self._run
                log.warning("%s/%s: work in progress not saved: %s", run.namespace, run.name, err)

    async def save(self) -> bool:
        """Read the work in progress and keep it (or drop the kept one when the worktree holds
        nothing beyond the base); whether one is kept now."""
        run = self._run
        async with self._lock:
            found = await self._client.read_wip(run.name)
            if found is None:
                await asyncio.to_thread(self._store.drop_wip, run.namespace, run.name, run.uid)
                return False
            meta = {
                "revision": found.revision,
                "base": found.base,
                "bytes": len(found.bundle),
                "savedAt": now_rfc3339(),
            }
            await asyncio.to_thread(
                self._store.write_wip, run.namespace, run.name, run.uid, found.bundle, meta
            )
            return True

    async def drop(self) -> None:
        """A turn settled: its delivery holds its work, and an older snapshot must never be
        laid over it."""
        run = self._run
        async with self._lock:
            await asyncio.to_thread(self._store.drop_wip, run.namespace, run.name, run.uid)


async def restore_wip(store: ArchiveStore, run: Run, client: WireClient) -> str | None:
    """Lay the archived work in progress over a resumed Session's new checkout; when it was
    saved if it was applied (the model's note says so), else None. The harness refuses it
    unless the checkout is at its base."""
    found = await asyncio.to_thread(store.read_wip, run.namespace, run.name, run.uid)
    if found is None:
        return None
    data, meta = found
    base = meta.get("base")
    wip = WorkInProgress(data, str(meta.get("revision") or ""), str(base) if base else None)
    refused = await client.apply_wip(run.name, wip)
    if refused is not None:
        log.warning("%s/%s: work in progress not applied in the new pod: %s",
                    run.namespace, run.name, refused)  # fmt: skip
        return None
    log.info("%s/%s: work in progress of %s applied in the new pod (%d bytes)",
             run.namespace, run.name, meta.get("savedAt"), len(data))  # fmt: skip
    return str(meta.get("savedAt") or "")
