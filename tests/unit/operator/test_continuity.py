"""Restoring a resumed Session's conversation (operator/corral_operator/session/continuity.py):
what the archive holds decides whether the turn in flight can be found in the new harness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral_api.kinds import AdmissionLedger, SessionStatus
from corral_api.wire import LogRestored
from corral_operator.archive.store import FileArchive
from corral_operator.session.continuity import LogArchiver, Run, restore

RUN = Run("agents", "fix-it", "u-1")


class HarnessStandIn:
    """The two log calls of the wire client, in memory (a stand-in for the harness)."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        self.restored: list[bytes] = []

    async def read_log(self, conversation: str, start: int) -> tuple[bytes, int]:
        lines = [json.dumps(r) + "\n" for r in self.records[start:]]
        return "".join(lines).encode(), len(self.records)

    async def restore_log(self, conversation: str, records: bytes) -> LogRestored | None:
        if self.restored:
            return None
        self.restored.append(records)
        return LogRestored(restored=True, records=2, events=1, interrupted=["sub_2"])


def _status(submission: str) -> SessionStatus:
    ledger = AdmissionLedger(stream_url="/s", offset=1, submission_id=submission, turn=2)
    return SessionStatus(phase="Running", turns=1, restarts=1, ledger=ledger)


async def test_the_log_is_archived_as_it_grows_and_restored_whole(tmp_path: Path) -> None:
    store = FileArchive(tmp_path)
    old = HarnessStandIn([{"k": "sub", "id": "sub_2"}, {"k": "ev", "e": {"type": "x"}}])
    archiver = LogArchiver(store, RUN, old)  # type: ignore[arg-type]
    assert await archiver.catch_up() == 2
    assert await archiver.catch_up() == 0  # nothing new: nothing written
    old.records.append({"k": "tx", "op": "append", "m": {"role": "user"}})
    assert await archiver.catch_up() == 1
    new = HarnessStandIn([])
    assert await restore(store, RUN, new, _status("sub_2")) is None  # type: ignore[arg-type]
    assert new.restored[0].count(b"\n") == 3
    # Restored once: a second pass of the same pod's drive sends nothing that changes it.
    assert await restore(store, RUN, new, _status("sub_2")) is None  # type: ignore[arg-type]


async def test_a_turn_whose_admission_never_reached_the_archive_is_recorded_lost(
    tmp_path: Path,
) -> None:
    store = FileArchive(tmp_path)
    new = HarnessStandIn([])
    lost = await restore(store, RUN, new, _status("sub_9"))  # type: ignore[arg-type]
    assert new.restored == []  # nothing archived: nothing to restore
    assert lost is not None and lost.ledger is None and lost.resume_interruptions == 1
    assert lost.last_settlement is not None and lost.last_settlement.turn == 2
    assert (lost.last_settlement.error or "").startswith("sandbox_lost:")
