"""The conversation log read back from record N (for the operator's archive and a restore), and
the check a restored log's records pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral_harness.conversations import RecordCheck
from corral_harness.store import ConversationLog


def _ev(offset: int) -> dict[str, Any]:
    return {"k": "ev", "e": {"offset": offset, "type": "x", "submissionId": "s"}}


def _read(log: ConversationLog, first: int, stop: int) -> bytes:
    return b"".join(log.read_from(first, stop))


def test_a_read_from_record_n_returns_whole_lines_across_a_reopen(tmp_path: Path) -> None:
    log = ConversationLog(tmp_path / "c", durable=False)
    for offset in range(3):
        log.append(_ev(offset))
    lines = log.path.read_bytes().splitlines(keepends=True)
    assert log.durable_count() == 3
    assert _read(log, 1, 3) == b"".join(lines[1:])
    assert _read(log, 3, 3) == b""
    log.close()
    # A later process (a boot) indexes what it reads, then goes on appending.
    again = ConversationLog(tmp_path / "c", durable=False)
    again.records()
    again.append({"k": "tx", "op": "append", "m": {"role": "user", "content": "é"}})
    assert again.durable_count() == 4
    assert _read(again, 0, 4) == again.path.read_bytes()
    assert _read(again, 3, 4).decode().startswith('{"k":"tx"')
    with pytest.raises(ValueError, match="not within"):
        again.read_from(2, 5)


def test_a_log_appended_to_without_a_read_is_indexed_from_its_file(tmp_path: Path) -> None:
    first = ConversationLog(tmp_path / "c", durable=False)
    first.append(_ev(0))
    first.close()
    second = ConversationLog(tmp_path / "c", durable=False)
    second.append(_ev(1))
    assert _read(second, 1, 2) == second.path.read_bytes().splitlines(keepends=True)[1]


def test_a_torn_tail_is_not_indexed(tmp_path: Path) -> None:
    log = ConversationLog(tmp_path / "c", durable=False)
    log.append(_ev(0))
    log.close()
    with log.path.open("a") as fh:
        fh.write('{"k":"ev","e":')
    again = ConversationLog(tmp_path / "c", durable=False)
    assert len(again.records()) == 1
    again.append(_ev(1))
    assert _read(again, 0, 2) == again.path.read_bytes()


async def test_only_synced_records_count_as_durable(tmp_path: Path) -> None:
    log = ConversationLog(tmp_path / "c", durable=True)
    log.append(_ev(0))
    log.append(_ev(1))
    assert log.durable_count() == 0
    await log.sync_until(1)
    assert log.durable_count() >= 1
    await log.sync_until(2)
    assert log.durable_count() == 2
    log.close()
    # What a boot reads is synced by the read: all of it counts.
    again = ConversationLog(tmp_path / "c", durable=True)
    again.records()
    again.append(_ev(2))
    assert again.durable_count() == 2
    await again.sync_until(again.written)
    assert again.durable_count() == 3
    again.close()


AGENT = {"identity": "x", "model": "corral-scripted"}
SUB = {"k": "sub", "id": "s", "message": "m", "model": "corral-scripted", "thinking": "off"}


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ([1], "a record is a JSON object"),
        ({"k": "zz"}, "unknown record kind 'zz'"),
        ({"e": {}}, "unknown record kind None"),
        ({**SUB}, "needs 'agent'"),
        ({**SUB, "agent": AGENT, "id": 3}, "needs 'id'"),
        ({**SUB, "agent": {"model": "m"}}, "identity"),
        ({**SUB, "agent": AGENT, "offset": "3"}, "'offset' must be int"),
        ({"k": "ev"}, "needs 'e'"),
        ({"k": "ev", "e": {"offset": 0, "type": "x"}}, "needs 'submissionId'"),
        (_ev(1), "event offset 1 where 0 comes next"),
        ({"k": "tx", "op": "append", "m": {"content": "x"}}, "with a role"),
        ({"k": "tx", "op": "append", "m": {"role": "user", "content": ["x"]}}, "are objects"),
        ({"k": "tx", "op": "result", "b": "x"}, "needs 'b'"),
        ({"k": "tx", "op": "drop"}, "unknown tx op 'drop'"),
    ],
)
def test_a_record_that_cannot_be_replayed_says_why(record: Any, problem: str) -> None:
    found = RecordCheck().problem(record)
    assert found is not None and problem in found


def test_records_that_replay_pass_and_events_count_in_sequence() -> None:
    check = RecordCheck()
    assert check.problem({**SUB, "agent": AGENT, "turn": None, "key": "k1"}) is None
    assert check.problem(_ev(0)) is None
    assert check.problem({"k": "tx", "op": "append", "m": {"role": "user", "content": "x"}}) is None
    assert check.problem({"k": "tx", "op": "result", "b": {"type": "tool_result"}}) is None
    assert check.problem(_ev(1)) is None
    assert check.problem(_ev(1)) == "event offset 1 where 2 comes next"
