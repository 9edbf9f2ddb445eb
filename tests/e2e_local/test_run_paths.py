"""`corral run` beyond the happy path: the guard's second turn, its spent budget, Ctrl-C, bad
input, and the workspace cloned from the Session's repo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import (
    EXAMPLES,
    FIX,
    corral_argv,
    corral_run,
    git,
    read_lines,
    run_argv,
    run_env,
    session_tree,
    unittest_passes,
    write_session,
)

pytestmark = pytest.mark.timeout(120)

GUARD = {"criteria": {"command": "python3 -m unittest -q"}, "turnBudget": 3}


def test_a_failed_evaluation_gives_another_turn_that_then_passes(
    demo_workspace: Path, tmp_path: Path
) -> None:
    session, scenario = write_session(
        tmp_path,
        evaluation=GUARD,
        scenario_replies=[
            {"text": "The code looks right to me; nothing to change."},
            # Only the driver's follow-up, which quotes the failing check, leads to the fix.
            {
                "when": {"last_user_contains": "did not pass"},
                **FIX,
                "otherwise": {"text": "no follow-up came"},
            },
            {"text": "Fixed the percentage."},
        ],
    )
    done = corral_run(
        "-f",
        str(session),
        "--workspace",
        str(demo_workspace),
        "--scenario",
        str(scenario),
        state_dir=tmp_path / "state",
    )
    assert done.code == 0, done.stderr + done.stdout
    assert unittest_passes(session_tree(demo_workspace, "corral/t1"))
    receipts = [line for line in done.ledger() if line["kind"] == "settlement"]
    assert [r["evaluation"]["passed"] for r in receipts] == [False, True]
    assert [r["outcome"] for r in receipts] == ["partial", "success"]
    admissions = [line for line in done.ledger() if line["kind"] == "admission"]
    assert "FAIL: test_percentage_discount" in admissions[1]["message"]
    state = done.state()
    assert (state["phase"], state["turns"], state["evaluationTurns"]) == ("Succeeded", 2, 2)


def test_the_guard_stops_the_session_when_its_budget_is_spent(
    demo_workspace: Path, tmp_path: Path
) -> None:
    session, scenario = write_session(
        tmp_path,
        evaluation={"criteria": {"command": "python3 -m unittest -q"}, "turnBudget": 2},
        scenario_replies=[{"text": "Nothing to do."}, {"text": "Still nothing to do."}],
    )
    done = corral_run(
        "-f",
        str(session),
        "--workspace",
        str(demo_workspace),
        "--scenario",
        str(scenario),
        state_dir=tmp_path / "state",
    )
    assert done.code == 1
    state = done.state()
    assert state["phase"] == "Failed" and state["turns"] == 2
    assert "turn budget of 2 is spent" in state["message"]
    assert "Failed: evaluation failed on turn 2" in done.stdout


def test_ctrl_c_aborts_the_turn_through_the_wire_and_leaves_a_consistent_state(
    demo_workspace: Path, tmp_path: Path
) -> None:
    session, scenario = write_session(
        tmp_path,
        evaluation=GUARD,
        scenario_replies=[
            {
                "text": "Running the tests.",
                "tool_use": {"name": "bash", "input": {"command": "true"}},
            },
            {"text": "This answer takes a long time.", "delay": 60},
        ],
    )
    state_dir = tmp_path / "state"
    process = subprocess.Popen(
        [*run_argv(session, demo_workspace, state_dir, "--scenario", str(scenario)), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=run_env(),
    )
    assert process.stdout is not None
    try:
        # Interrupt once the tool has run and the model is "thinking" about its next answer.
        for line in process.stdout:
            if line.startswith("{") and json.loads(line).get("type") == "step_boundary":
                break
        else:
            raise AssertionError("the run ended before its first step")
        time.sleep(0.3)
        parts = _child_pids(process.pid)
        began = time.monotonic()
        process.send_signal(signal.SIGINT)
        rest, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert time.monotonic() - began < 15
    events = [json.loads(x) for x in rest.splitlines() if x.startswith("{")]
    settled = [e for e in events if e.get("type") == "settled" and "offset" in e]
    assert settled and settled[-1]["status"] == "aborted"
    assert settled[-1]["error"]["type"] == "submission_aborted"

    state = json.loads((state_dir / "state.json").read_text())
    assert state["phase"] == "Stopped" and state["ledger"] is None
    assert state["lastSettlement"]["status"] == "aborted"
    receipts = [x for x in read_lines(state_dir / "ledger.jsonl") if x["kind"] == "settlement"]
    assert [r["outcome"] for r in receipts] == ["stopped"]
    assert receipts[0]["evaluation"] is None  # an aborted turn is not judged
    # The transcript ends with the settlement, and the partial answer was kept before it.
    transcript = read_lines(state_dir / "transcript.jsonl")
    assert transcript[-1]["type"] == "settled"
    # Every local part (model, custodian, harness) was stopped with the run.
    assert len(parts) == 3
    assert not [pid for pid in parts if _alive(pid)]


def test_bad_yaml_is_refused_with_the_api_servers_words(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: corral.dev/v1alpha1\nkind: Agent\nmetadata: {name: a}\n"
        "spec: {identity: x, model: m, orchestrator: true, limits: {maxDepth: 7}}\n"
    )
    done = corral_run("-f", str(bad), state_dir=tmp_path / "state", timeout=30)
    assert done.code == 2
    assert done.stderr.strip() == (
        'corral run: error: The Agent "a" is invalid: spec.limits.maxDepth: Invalid value: 7: '
        "spec.limits.maxDepth in body should be less than or equal to 3"
    )
    assert not (tmp_path / "state").exists()


def test_without_workspace_the_sessions_repo_is_copied_into_the_state_dir(
    tmp_path: Path,
) -> None:
    done = corral_run("-f", str(EXAMPLES / "session.yaml"), "--json", state_dir=tmp_path / "state")
    assert done.code == 0, done.stderr + done.stdout
    workspace = tmp_path / "state" / "workspace"
    assert git(workspace, "branch", "--show-current").strip() == "corral/fix-discount"
    assert "discount_percent / 100" in (workspace / "shop" / "pricing.py").read_text()
    # The shipped example is untouched.
    assert (
        "discount_percent / 100"
        not in (EXAMPLES / "demo" / "repo" / "shop" / "pricing.py").read_text()
    )
    assert os.path.samefile(tmp_path / "state", done.state_dir)


def test_a_model_the_harness_does_not_know_is_refused_at_admission(
    demo_workspace: Path, tmp_path: Path
) -> None:
    session, _ = write_session(tmp_path, scenario_replies=[], evaluation=None)
    session.write_text(session.read_text().replace("claude-sonnet-4-5", "gpt-nine"))
    env = run_env() | {"ANTHROPIC_API_KEY": "sk-unused", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    done = subprocess.run(
        run_argv(session, demo_workspace, tmp_path / "state"),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1
    assert "admission rejected (400)" in done.stderr and "gpt-nine" in done.stderr


def test_a_missing_scenario_is_bad_input(demo_workspace: Path, tmp_path: Path) -> None:
    session, _ = write_session(tmp_path, scenario_replies=[], evaluation=None)
    done = corral_run(
        "-f",
        str(session),
        "--workspace",
        str(demo_workspace),
        "--scenario",
        str(tmp_path / "nope.yaml"),
        state_dir=tmp_path / "state",
        timeout=30,
    )
    assert done.code == 2
    assert f"--scenario {tmp_path / 'nope.yaml'}: no such file" in done.stderr


def test_a_part_that_cannot_start_is_reported_with_its_log(
    demo_workspace: Path, tmp_path: Path
) -> None:
    session, scenario = write_session(tmp_path, scenario_replies=[], evaluation=None)
    scenario.write_text("default: [{fault: {status: 'not a number'}}]\n")
    done = corral_run(
        "-f",
        str(session),
        "--workspace",
        str(demo_workspace),
        "--scenario",
        str(scenario),
        state_dir=tmp_path / "state",
        timeout=30,
    )
    assert done.code == 1
    assert "the scripted-model exited with code" in done.stderr
    assert str(tmp_path / "state" / "logs" / "scripted-model.log") in done.stderr


def test_a_killed_run_leaves_nothing_running_and_a_rerun_reattaches(
    demo_workspace: Path, tmp_path: Path
) -> None:
    """kill -9 mid-turn: the parts go with it; the same --state-dir then re-attaches to the
    submission in its ledger (the restarted harness settled it `failed`), never admits it
    again, and records the session as failed."""
    session, scenario = write_session(
        tmp_path,
        evaluation=None,
        scenario_replies=[
            {"tool_use": {"name": "bash", "input": {"command": "true"}}},
            {"text": "Slow.", "delay": 60},
        ],
    )
    state_dir = tmp_path / "state"
    argv = [*run_argv(session, demo_workspace, state_dir, "--scenario", str(scenario)), "--json"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=run_env())
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("{") and json.loads(line).get("type") == "step_boundary":
            break
    harness_pid = _child_pids(process.pid)
    assert harness_pid
    process.kill()
    process.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() and _alive(pid) for pid in harness_pid):
        assert time.monotonic() < deadline, "a part outlived corral run"
        time.sleep(0.1)
    before = json.loads((state_dir / "state.json").read_text())
    assert before["phase"] == "Running" and before["ledger"] is not None

    again = corral_run(*argv[len(corral_argv()) + 1 : -3], "--json", state_dir=state_dir)
    assert again.code == 1
    state = again.state()
    assert state["phase"] == "Failed" and state["ledger"] is None
    assert state["lastSettlement"]["submissionId"] == before["ledger"]["submissionId"]
    assert state["lastSettlement"]["status"] == "failed"
    admissions = [x for x in again.ledger() if x["kind"] == "admission"]
    assert len(admissions) == 1  # the first run's; the re-run admitted nothing


def _child_pids(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
