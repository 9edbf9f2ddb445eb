"""The archive's filesystem backend and record (docs/history.md), on a real directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral_operator.archive import FileArchive, build_record, receipts_of

EVENTS = [
    {"offset": 0, "type": "turn_started", "submissionId": "s1"},
    {"offset": 1, "type": "tool_start", "submissionId": "s1", "name": "bash"},
    {"offset": 2, "type": "settled", "submissionId": "s1", "status": "completed",
     "usage": {"input": 10, "output": 2}, "receipt": {"toolsRun": ["bash"]}},
    {"offset": 3, "type": "settled", "submissionId": "s2", "status": "failed",
     "error": {"type": "runaway", "message": "too many"}},
]  # fmt: skip
SESSION = {
    "apiVersion": "corral.dev/v1alpha1",
    "kind": "Session",
    "metadata": {"name": "s", "namespace": "ns", "uid": "u-1", "managedFields": [{}]},
    "spec": {"agentRef": "a"},
    "status": {"phase": "Failed"},
}


def test_receipts_are_one_per_settlement_in_order() -> None:
    receipts = receipts_of(EVENTS)
    assert [(r["settlement"], r["offset"], r["status"]) for r in receipts] == [
        (1, 2, "completed"),
        (2, 3, "failed"),
    ]
    assert receipts[0]["receipt"] == {"toolsRun": ["bash"]} and "error" not in receipts[0]
    assert receipts[1]["error"]["type"] == "runaway"


def test_a_record_keeps_the_session_without_its_bookkeeping(tmp_path: Path) -> None:
    record = build_record(SESSION, EVENTS, archived_at="2026-01-01T00:00:00Z", cause="ttl")
    assert record["format"] == "corral.dev/archive/v1" and record["events"] == 4
    assert "managedFields" not in record["session"]["metadata"]
    store = FileArchive(tmp_path)
    store.write("ns", "s", "u-1", record, EVENTS)
    lines = (tmp_path / "ns" / "s" / "u-1" / "events.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == EVENTS
    back = store.read("ns", "s")
    assert back is not None and back.uid == "u-1" and back.events == EVENTS


def test_the_last_archived_run_of_a_name_is_read_and_a_rewrite_replaces(tmp_path: Path) -> None:
    store = FileArchive(tmp_path)
    for uid, stamp in (("old", "2026-01-01T00:00:00Z"), ("new", "2026-01-02T00:00:00Z")):
        meta = {**SESSION["metadata"], "uid": uid}  # type: ignore[dict-item]
        record = build_record({**SESSION, "metadata": meta}, [], archived_at=stamp, cause="x")
        store.write("ns", "s", uid, record, [])
    latest = store.read("ns", "s")
    assert latest is not None and latest.uid == "new"
    assert store.read("ns", "s", "old") is not None and store.read("ns", "gone") is None
    again = build_record(SESSION, EVENTS[:1], archived_at="2026-01-03T00:00:00Z", cause="x")
    store.write("ns", "s", "old", again, EVENTS[:1])
    reread = store.read("ns", "s", "old")
    assert reread is not None and reread.events == EVENTS[:1]
    assert sorted(p.name for p in (tmp_path / "ns" / "s").iterdir()) == ["new", "old"]


@pytest.mark.parametrize(
    ("namespace", "name", "uid"), [("..", "s", "u"), ("ns", "a/b", "u"), ("ns", "s", "../x")]
)
def test_a_name_is_never_a_path(tmp_path: Path, namespace: str, name: str, uid: str) -> None:
    with pytest.raises(ValueError, match="is not a Kubernetes"):
        FileArchive(tmp_path).write(namespace, name, uid, {}, [])
