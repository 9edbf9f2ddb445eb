"""`corral run` and the one-shot wake: the real harness, custodian, scripted model and driver
wait in the foreground, then admit the wake message as the next turn, once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .conftest import corral_run, write_session

pytestmark = pytest.mark.timeout(120)


def test_corral_run_waits_for_the_wake_then_admits_it_once(
    demo_workspace: Path, tmp_path: Path
) -> None:
    session, scenario = write_session(
        tmp_path,
        evaluation=None,
        scenario_replies=[{"text": "First look done."}, {"text": "Woken and finished."}],
    )
    agent_doc, session_doc = (json.loads(d) for d in session.read_text().split("\n---\n"))
    session_doc["spec"]["wake"] = {"afterSeconds": 2, "message": "WAKE-e2e: finish the task."}
    session.write_text(json.dumps(agent_doc) + "\n---\n" + json.dumps(session_doc) + "\n")

    started = time.monotonic()
    done = corral_run(
        "-f", str(session), "--workspace", str(demo_workspace), "--scenario", str(scenario),
        state_dir=tmp_path / "state",
    )  # fmt: skip
    assert done.code == 0, done.stderr + done.stdout
    assert time.monotonic() - started >= 2  # it did wait for the wake
    state = json.loads((done.state_dir / "state.json").read_text())
    assert state["phase"] == "Succeeded" and state["turns"] == 2
    assert state["wokenAt"] >= state["wakeAt"]
    assert state["answer"] == "Woken and finished."
    assert "one-shot wake" in done.stderr + done.stdout
    # The wake message was admitted as turn 2, once (the ledger records each admission).
    ledger = [
        json.loads(line) for line in (done.state_dir / "ledger.jsonl").read_text().splitlines()
    ]
    admissions = [(e["turn"], e["message"]) for e in ledger if e["kind"] == "admission"]
    assert admissions == [(1, "Make the tests pass."), (2, "WAKE-e2e: finish the task.")]
    outcomes = [e.get("outcome") for e in ledger if e["kind"] == "settlement"]
    assert outcomes == ["success", "success"], ledger
