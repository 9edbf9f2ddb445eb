"""`corral run`'s inline flags (docs/cli.md): `--dry-run -o yaml` prints the Agent and Session
the flags make of the file and starts nothing; `--max-turns` ends a real run (harness,
custodian, scripted model) at that turn; `--task` with no -f runs a Session built for the
Agent given; a flag's bad value is refused as the same value in the YAML is."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import corral_argv, corral_run, run_env, write_session

pytestmark = pytest.mark.timeout(180)


def test_dry_run_prints_what_the_flags_make_and_starts_nothing(tmp_path: Path) -> None:
    session, _ = write_session(tmp_path, evaluation=None, scenario_replies=[])
    state = tmp_path / "state"
    done = corral_run("-f", str(session), "--task", "Only the docs.", "--model",
                      "claude-haiku-4-5", "--max-turns", "2", "--max-budget-usd", "0.5",
                      "--dry-run", "-o", "yaml", state_dir=state)  # fmt: skip
    assert done.code == 0, done.stderr
    agent, printed = yaml.safe_load_all(done.stdout)
    assert agent["kind"] == "Agent" and agent["spec"]["limits"]["maxTurns"] == 2
    assert printed["kind"] == "Session" and printed["spec"]["task"] == "Only the docs."
    assert printed["spec"]["overrides"] == {"model": "claude-haiku-4-5"}
    assert printed["spec"]["budget"] == {"costUSD": 0.5}
    assert not state.exists()  # nothing written, nothing locked
    again = subprocess.run([*corral_argv(), "run", "-f", "-", "--dry-run", "-o", "json"],
                           input=done.stdout, capture_output=True, text=True, env=run_env(),
                           timeout=60)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert [i["kind"] for i in json.loads(again.stdout)["items"]] == ["Agent", "Session"]
    bad = corral_run("-f", str(session), "--max-budget-usd", "-1", "--dry-run", state_dir=state)
    assert bad.code == 2 and "--max-budget-usd" in bad.stderr and "costUSD" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_max_turns_ends_the_run_at_that_turn(demo_workspace: Path, tmp_path: Path) -> None:
    session, scenario = write_session(
        tmp_path,
        evaluation={"criteria": {"command": "false"}, "turnBudget": 5},
        scenario_replies=[{"text": "Done, I think."}] * 5,
    )
    done = corral_run("-f", str(session), "--workspace", str(demo_workspace), "--scenario",
                      str(scenario), "--max-turns", "1", "--json",
                      state_dir=tmp_path / "state")  # fmt: skip
    assert done.code == 1, done.stderr + done.stdout
    assert done.state()["turns"] == 1  # the file's Agent allows 5


def test_task_alone_runs_on_the_agent_given(demo_workspace: Path, tmp_path: Path) -> None:
    files, scenario = write_session(tmp_path, evaluation=None,
                                    scenario_replies=[{"text": "Nothing to change."}])  # fmt: skip
    agent = tmp_path / "agent.yaml"
    agent.write_text(files.read_text().split("\n---\n", 1)[0])
    task = "Say what this repository is for."
    done = corral_run("--task", task, "--agent", str(agent), "--workspace",
                      str(demo_workspace), "--scenario", str(scenario), "--json",
                      state_dir=tmp_path / "state")  # fmt: skip
    assert done.code == 0, done.stderr + done.stdout
    assert done.lines()[-1]["outcome"] == "Succeeded"
    # The harness held the conversation of a Session named after the task, which it was given.
    [log] = (done.state_dir / "harness" / "conversations" / "fixer").glob("task-*/log.jsonl")
    assert task in log.read_text()
