"""The conversation log: records, replay, torn lines, and the group commit's bookkeeping."""

from __future__ import annotations

import json
from pathlib import Path

from corral_harness.store import ConversationLog, conversation_dir, conversation_dirs


async def test_records_replay_and_sync(tmp_path: Path) -> None:
    log = ConversationLog(conversation_dir(tmp_path, "agent", "c1"), durable=True)
    assert not log.exists()
    first = log.append({"k": "ev", "e": {"offset": 0}})
    second = log.append({"k": "tx", "op": "append", "m": {"role": "user", "content": "é"}})
    assert (first, second) == (1, 2)
    assert log.synced == 0  # written, not yet known to be on disk
    await log.sync_until(second)
    assert log.synced == 2
    await log.sync_until(1)  # already covered: no new sync needed
    log.close()
    assert [r["k"] for r in ConversationLog(log.directory, durable=True).records()] == ["ev", "tx"]
    assert list(conversation_dirs(tmp_path)) == [("agent", "c1", log.directory)]


def test_a_torn_last_line_ends_the_replay(tmp_path: Path) -> None:
    log = ConversationLog(tmp_path / "c", durable=False)
    log.append({"k": "ev", "e": {"offset": 0}})
    assert log.synced == log.written == 1  # not durable: nothing to wait for
    log.close()
    with log.path.open("a") as fh:
        fh.write(json.dumps({"k": "ev"})[:5])
    assert len(list(ConversationLog(tmp_path / "c", durable=False).records())) == 1
