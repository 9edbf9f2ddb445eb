"""`corral run` shows each turn's ledger: the real harness, custodian, scripted model and driver
(docs/ledger.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import corral_run, write_session

pytestmark = pytest.mark.timeout(120)


def test_the_run_prints_the_turns_ledger(demo_workspace: Path, tmp_path: Path) -> None:
    session, scenario = write_session(
        tmp_path,
        evaluation=None,
        scenario_replies=[
            {"tool_use": {"name": "bash", "input": {"command": "echo checking"}}},
            {"text": "All good."},
        ],
    )
    done = corral_run(
        "-f", str(session), "--workspace", str(demo_workspace), "--scenario", str(scenario),
        state_dir=tmp_path / "state",
    )  # fmt: skip
    assert done.code == 0, done.stderr + done.stdout
    ledger = next(line for line in done.stdout.splitlines() if line.startswith("ledger: "))
    assert ledger.startswith("ledger: success via ")
    assert "1 tools run, 0 blocked" in ledger
    assert "phases: " in done.stdout and "→ done" in done.stdout
