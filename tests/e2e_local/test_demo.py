"""`corral run` on the shipped example: the scripted model really edits and really tests."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .conftest import (
    EXAMPLES,
    ROOT,
    corral_argv,
    corral_run,
    git,
    run_env,
    session_tree,
    unittest_passes,
)

pytestmark = pytest.mark.timeout(120)


def test_the_demo_session_fixes_the_bug_and_the_guard_confirms_it(
    demo_workspace: Path, tmp_path: Path
) -> None:
    assert not unittest_passes(demo_workspace)
    done = corral_run(
        "-f",
        str(EXAMPLES / "session.yaml"),
        "--workspace",
        str(demo_workspace),
        "--json",
        state_dir=tmp_path / "state",
    )
    assert done.code == 0, done.stderr + done.stdout

    # The file really changed, and only the code, not the tests: committed at the turn's end
    # as the agent, on the session's branch made from HEAD (docs/delivery.md); the person's
    # branch and files are as they were.
    branch = "corral/fix-discount"
    diff = git(demo_workspace, "diff", "--name-only", "main", branch).split()
    assert diff == ["shop/pricing.py"]
    assert git(demo_workspace, "rev-list", "--count", f"main..{branch}").strip() == "1"
    assert git(demo_workspace, "log", "-1", "--format=%an", branch).strip() == "fixer"
    assert git(demo_workspace, "status", "--porcelain") == ""
    assert git(demo_workspace, "branch", "--show-current").strip() == "main"
    assert not unittest_passes(demo_workspace)
    assert unittest_passes(session_tree(demo_workspace, branch))

    # Every tool really ran through the harness.
    transcript = done.transcript()
    ended = [e for e in transcript if e["type"] == "tool_end"]
    assert [e["name"] for e in ended] == ["bash", "read", "edit", "bash"]
    # The first test run fails (a non-zero exit is an error result); the rest succeed.
    assert [e["isError"] for e in ended] == [True, False, False, False]
    assert "-180.0 != 18.0" in ended[0]["result"]
    assert transcript[-1]["type"] == "settled" and transcript[-1]["status"] == "completed"

    # The ledger: one admission, one settlement whose evaluation ran the command and passed.
    ledger = done.ledger()
    assert [line["kind"] for line in ledger] == ["admission", "settlement"]
    receipt = ledger[1]
    assert receipt["outcome"] == "success" and receipt["toolsRun"] == 4
    assert receipt["evaluation"]["passed"] is True
    assert "python3 -m unittest -q" in receipt["evaluation"]["summary"]

    state = done.state()
    assert state["phase"] == "Succeeded" and state["turns"] == 1 and state["ledger"] is None
    assert state["evaluationTurns"] == 1

    lines = done.lines()
    outcome = lines[-2] if lines[-1].get("type") == "note" else lines[-1]
    assert outcome["type"] == "outcome" and outcome["phase"] == "Succeeded"
    assert outcome["exitCode"] == 0
    assert outcome["branch"] == branch
    assert outcome["committed"] == git(demo_workspace, "rev-parse", branch).strip()
    assert {"type": "note", "text": f"committed {outcome['committed']} on {branch}"} in lines
    assert any(str(done.state_dir) in line.get("text", "") for line in lines)


def test_without_a_tty_the_view_is_plain_lines(demo_workspace: Path, tmp_path: Path) -> None:
    done = corral_run(
        "-f",
        str(EXAMPLES / "session.yaml"),
        "--workspace",
        str(demo_workspace),
        state_dir=tmp_path / "state",
    )
    assert done.code == 0, done.stderr + done.stdout
    assert "\x1b[" not in done.stdout  # no colour, no cursor movement
    out = done.stdout
    assert re.search(r"^▶ bash python3 -m unittest -q$", out, re.M)
    assert re.search(r"^▶ edit .*shop/pricing.py", out, re.M)
    assert "evaluation PASS: `python3 -m unittest -q` passed (exit 0)" in out
    assert re.search(r"^usage: tokens in \d+ out \d+", out, re.M)
    assert f"state directory: {done.state_dir}" in out
    assert "Succeeded: evaluation passed on turn 1" in out


def test_the_demo_script_make_demo_runs(tmp_path: Path) -> None:
    """demo/run_demo.sh: a fresh copy of the example, the session, the diff and the record."""
    env = run_env() | {"TMPDIR": str(tmp_path), "CORRAL_DEMO_STATE_DIR": str(tmp_path / "rec")}
    if len(corral_argv()) == 1:
        env["CORRAL_BIN"] = corral_argv()[0]
    done = subprocess.run(
        ["bash", str(ROOT / "demo" / "run_demo.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    out = done.stdout
    assert "Succeeded: evaluation passed on turn 1" in out
    assert "+    discount = subtotal * discount_percent / 100" in out  # the diff it shows
    assert f"the record of the session is in {tmp_path / 'rec'}" in out
    workspace = next(tmp_path.glob("corral-demo.*"))
    assert unittest_passes(session_tree(workspace, "corral/fix-discount"))
    assert (tmp_path / "rec" / "ledger.jsonl").exists()
