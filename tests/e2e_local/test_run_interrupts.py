"""`corral run` interrupted at any moment, its state directory held, and its last line.

Ctrl-C is sent as a terminal sends it: SIGINT to the foreground process group (the run is
started in a session of its own; its local parts run in theirs, so they are stopped by the run,
not by the signal). Whenever it comes (starting, mid-turn, after the session finished, while
the parts stop) the run ends with exit 130, the outcome as its last line, no traceback, every
part gone and a record a re-run can pick up from (docs/cli.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .conftest import FIX, corral_argv, git, read_lines, run_argv, run_env, write_session

pytestmark = pytest.mark.timeout(120)

SLOW = {"text": "This answer takes a long time.", "delay": 60}
DONE = {"text": "Fixed the discount."}


@contextmanager
def started(argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    """`corral run` in a process group of its own, as a shell runs a foreground job."""
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=run_env(),
        start_new_session=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def ctrl_c(process: subprocess.Popen[str]) -> None:
    os.killpg(process.pid, signal.SIGINT)


def read_until(
    process: subprocess.Popen[str], wanted: Callable[[dict[str, Any]], bool]
) -> list[str]:
    """The JSON lines up to and including the first `wanted` one."""
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith("{") and wanted(json.loads(line)):
            return seen
    raise AssertionError(f"the run ended before the line looked for: {seen[-5:]}")


def finish(process: subprocess.Popen[str], seen: list[str]) -> tuple[list[dict[str, Any]], str]:
    rest, err = process.communicate(timeout=60)
    lines = [json.loads(x) for x in [*seen, *rest.splitlines()] if x.startswith("{")]
    assert "Traceback" not in err, err
    return lines, err


def note(text: str) -> Callable[[dict[str, Any]], bool]:
    return lambda line: line.get("type") == "note" and str(line.get("text", "")).startswith(text)


def _children(pid: int) -> list[int]:
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
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _session(tmp_path: Path, replies: list[Any]) -> tuple[Path, Path]:
    return write_session(tmp_path, scenario_replies=replies, evaluation=None)


def test_ctrl_c_mid_turn_from_the_terminal_ends_with_the_outcome_line(
    demo_workspace: Path, tmp_path: Path
) -> None:
    session, scenario = _session(tmp_path, [{"tool_use": {"name": "bash", "input": {
        "command": "true"}}}, SLOW])  # fmt: skip
    state_dir = tmp_path / "state"
    argv = [*run_argv(session, demo_workspace, state_dir, "--scenario", str(scenario)), "--json"]
    with started(argv) as process:
        seen = read_until(process, lambda line: line.get("type") == "step_boundary")
        parts = _children(process.pid)
        ctrl_c(process)
        lines, _ = finish(process, seen)
    assert process.returncode == 130
    outcome = lines[-1]
    assert outcome["type"] == "outcome" and outcome["outcome"] == "Stopped", outcome
    assert outcome["exitCode"] == 130 and outcome["error"] is None
    state = json.loads((state_dir / "state.json").read_text())
    assert state["phase"] == "Stopped" and state["ledger"] is None
    assert [x["outcome"] for x in read_lines(state_dir / "ledger.jsonl") if
            x["kind"] == "settlement"] == ["stopped"]  # fmt: skip
    assert parts and not [pid for pid in parts if _alive(pid)]


def test_ctrl_c_after_the_session_finished_and_while_the_parts_stop_keeps_the_outcome(
    demo_workspace: Path, tmp_path: Path
) -> None:
    """The issue's case: a run that succeeded, Ctrl-C during its teardown. The outcome line is
    still printed (Succeeded, with the answer and the commit), the record says Succeeded, and
    the exit status says the run was interrupted."""
    session, scenario = _session(tmp_path, [FIX, DONE])
    state_dir = tmp_path / "state"
    argv = [*run_argv(session, demo_workspace, state_dir, "--scenario", str(scenario)), "--json"]
    with started(argv) as process:
        seen = read_until(process, lambda line: line.get("type") == "finished")
        parts = _children(process.pid)
        ctrl_c(process)  # the session is over; the run has not stopped its parts yet
        seen += read_until(process, note("stopping the local parts"))
        ctrl_c(process)  # while they stop: no more grace
        time.sleep(0.05)
        ctrl_c(process)
        lines, _ = finish(process, seen)
    assert process.returncode == 130
    outcome = lines[-1]
    assert outcome["type"] == "outcome" and outcome["outcome"] == "Succeeded", outcome
    assert outcome["exitCode"] == 130
    assert outcome["answer"] == "Fixed the discount."
    assert outcome["commit"] == git(demo_workspace, "rev-parse", "corral/t1").strip()
    assert json.loads((state_dir / "state.json").read_text())["phase"] == "Succeeded"
    assert parts and not [pid for pid in parts if _alive(pid)]


def test_ctrl_c_while_the_parts_start_stops_the_run_cleanly(
    demo_workspace: Path, tmp_path: Path
) -> None:
    session, scenario = _session(tmp_path, [DONE])
    state_dir = tmp_path / "state"
    argv = [*run_argv(session, demo_workspace, state_dir, "--scenario", str(scenario)), "--json"]
    with started(argv) as process:
        seen = read_until(process, note("workspace: "))
        ctrl_c(process)
        lines, _ = finish(process, seen)
    assert process.returncode == 130
    outcome = lines[-1]
    assert outcome["type"] == "outcome" and outcome["exitCode"] == 130, outcome
    assert outcome["outcome"] in ("Interrupted", "Stopped"), outcome
    assert not [pid for pid in _children(process.pid) if _alive(pid)]


def test_a_state_directory_in_use_is_refused_and_a_dead_runs_lock_is_not(
    demo_workspace: Path, tmp_path: Path
) -> None:
    session, scenario = _session(tmp_path, [{"tool_use": {"name": "bash", "input": {
        "command": "true"}}}, SLOW])  # fmt: skip
    state_dir = tmp_path / "state"
    argv = [*run_argv(session, demo_workspace, state_dir, "--scenario", str(scenario)), "--json"]
    with started(argv) as first:
        read_until(first, lambda line: line.get("type") == "step_boundary")
        token = (state_dir / "secrets" / "wire-token").read_text()
        second = subprocess.run(argv, capture_output=True, text=True, env=run_env(), timeout=60)
        assert second.returncode == 2, second.stderr
        assert f"is in use by corral run (pid {first.pid})" in second.stderr
        assert "Traceback" not in second.stderr
        assert json.loads(second.stdout.splitlines()[-1])["outcome"] == "Error"
        # The first run's secrets are its own still: nothing of the second was written.
        assert (state_dir / "secrets" / "wire-token").read_text() == token
        assert first.poll() is None
        os.killpg(first.pid, signal.SIGKILL)  # as a crash would: the lock file stays behind
        first.wait()
    assert (state_dir / "corral-run.lock").read_text().strip() == str(first.pid)
    again = subprocess.run(argv, capture_output=True, text=True, env=run_env(), timeout=90)
    assert "in use" not in again.stderr, again.stderr
    assert again.returncode == 1, again.stderr  # it re-attached: the killed turn settled failed
    state = json.loads((state_dir / "state.json").read_text())
    assert state["phase"] == "Failed" and state["lastSettlement"]["status"] == "failed"


def test_json_ends_with_one_object_carrying_outcome_answer_commit_and_error(
    demo_workspace: Path, tmp_path: Path
) -> None:
    session, scenario = _session(tmp_path, [FIX, DONE])
    state_dir = tmp_path / "state"
    argv = [*run_argv(session, demo_workspace, state_dir, "--scenario", str(scenario)), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, env=run_env(), timeout=90)
    assert done.returncode == 0, done.stderr
    *_, last = done.stdout.splitlines()
    outcome = json.loads(last)
    assert outcome["type"] == "outcome" and outcome["outcome"] == "Succeeded"
    assert outcome["answer"] == "Fixed the discount."
    assert outcome["commit"] == git(demo_workspace, "rev-parse", "corral/t1").strip()
    assert outcome["error"] is None and outcome["exitCode"] == 0
    # Nothing but the record's note and the outcome come after the settlement.
    assert all(line.startswith("{") for line in done.stdout.splitlines())


def test_json_says_an_error_as_the_last_object_too(demo_workspace: Path, tmp_path: Path) -> None:
    session, _ = _session(tmp_path, [DONE])
    argv = [*corral_argv(), "run", "-f", str(session), "--workspace", str(tmp_path / "nope"),
            "--state-dir", str(tmp_path / "state"), "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=run_env(), timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome["outcome"] == "Error" and outcome["exitCode"] == 2
    assert "is not a directory" in outcome["error"]["message"]
    assert {"answer", "commit"} <= set(outcome)
