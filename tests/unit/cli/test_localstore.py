"""The local record: state.json written atomically, the ledger's receipts, the transcript."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from corral_api.kinds import AdmissionLedger, Usage
from corral_cli._localstore import LocalTurnStore, RunRecord, read_jsonl, write_atomically
from corral_operator.driver import DriverState


async def test_a_fresh_directory_loads_a_pending_state(tmp_path: Path) -> None:
    store = LocalTurnStore(tmp_path / "run")
    state = await store.load()
    assert state.phase == "Pending" and state.turns == 0 and state.ledger is None


async def test_state_round_trips_in_the_session_status_spelling(tmp_path: Path) -> None:
    store = LocalTurnStore(tmp_path)
    state = DriverState(
        phase="Running",
        turns=2,
        ledger=AdmissionLedger(
            stream_url="/agents/a/c/updates", offset=7, submission_id="s3", turn=3
        ),
        usage=Usage(input_tokens=10, output_tokens=5, cost=0.25),
        evaluation_turns=2,
        message="evaluation failed",
    )
    await store.save(state)
    raw = json.loads((tmp_path / "state.json").read_text())
    assert raw["ledger"] == {
        "streamUrl": "/agents/a/c/updates",
        "offset": 7,
        "submissionId": "s3",
        "turn": 3,
    }
    assert raw["evaluationTurns"] == 2 and raw["usage"]["inputTokens"] == 10
    again = await LocalTurnStore(tmp_path).load()
    assert again == state


def test_an_atomic_write_leaves_the_old_file_when_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")

    def broken_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise OSError("disk went away")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        write_atomically(target, "new")
    assert target.read_text() == "old"


def wire(offset: int, kind: str, submission: str = "s1", **fields: Any) -> dict[str, Any]:
    return {"offset": offset, "type": kind, "submissionId": submission, **fields}


def test_the_ledger_has_one_line_per_admission_and_per_settlement(tmp_path: Path) -> None:
    record = RunRecord(tmp_path)
    record.record(
        {
            "source": "driver",
            "type": "admitted",
            "turn": 1,
            "submissionId": "s1",
            "message": "fix it",
        }
    )
    events = [
        wire(0, "submission_started"),
        wire(1, "tool_start", name="bash"),
        wire(2, "tool_end", name="bash", isError=False, result="ok"),
        wire(3, "tool_blocked", name="write", outcome="deny", reason="read-only"),
        wire(4, "tool_end", name="read", isError=False, result="..."),
        wire(5, "settled", status="completed", text="done"),
    ]
    for event in events:
        record.record(event)
    # A re-attached wait reads some events again; they are counted once.
    record.record(events[2])
    record.record(
        {
            "source": "driver",
            "type": "settled",
            "turn": 1,
            "submissionId": "s1",
            "status": "completed",
            "error": None,
            "usage": {"input": 3, "output": 4},
            "evaluation": {"passed": False, "summary": "`t` failed (exit 1)"},
            "decision": {"action": "continue", "phase": "Running", "message": "again"},
        }
    )
    ledger = read_jsonl(tmp_path / "ledger.jsonl")
    assert [line["kind"] for line in ledger] == ["admission", "settlement"]
    receipt = ledger[1]
    assert receipt["toolsRun"] == 2 and receipt["toolsBlocked"] == 1
    assert receipt["status"] == "completed" and receipt["outcome"] == "partial"
    assert receipt["evaluation"]["passed"] is False
    transcript = read_jsonl(tmp_path / "transcript.jsonl")
    assert len(transcript) == len(events) + 1
    assert transcript[0]["type"] == "submission_started"


@pytest.mark.parametrize(
    ("decision", "outcome"),
    [
        ({"action": "finish", "phase": "Succeeded"}, "success"),
        ({"action": "finish", "phase": "Failed"}, "failed"),
        ({"action": "finish", "phase": "Stopped"}, "stopped"),
        ({"action": "finish", "phase": "WaitingForHuman"}, "handed_to_human"),
    ],
)
def test_outcomes(tmp_path: Path, decision: dict[str, str], outcome: str) -> None:
    record = RunRecord(tmp_path)
    record.record(
        {
            "source": "driver",
            "type": "settled",
            "turn": 1,
            "submissionId": "s",
            "status": "completed",
            "decision": decision,
        }
    )
    assert read_jsonl(tmp_path / "ledger.jsonl")[0]["outcome"] == outcome
