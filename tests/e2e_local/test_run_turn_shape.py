"""`corral run` and the turn's shape (docs/turns.md): a question is asked on the terminal and
the next turn starts from the answer; `make demo SCENARIO=plan` shows a forced plan whose
checked step misses once, is replanned, and holds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .conftest import (
    ROOT,
    corral_argv,
    run_argv,
    run_env,
    session_tree,
    unittest_passes,
    write_session,
)

pytestmark = pytest.mark.timeout(120)


def test_corral_run_asks_the_question_on_the_terminal_and_goes_on_from_the_answer(
    demo_workspace: Path, tmp_path: Path
) -> None:
    classify = {"understood": "fix something", "done": "it is fixed"}
    session, scenario = write_session(
        tmp_path,
        evaluation=None,
        scenario_replies=[
            {"classify": {**classify, "clear": False, "question": "Which module?"}},
            {
                "classify": {**classify, "clear": True, "route": "direct"},
                "when": {"last_user_contains": "pricing"},
            },
            {"text": "I will look at pricing."},
        ],
    )
    agent_doc, session_doc = (json.loads(d) for d in session.read_text().split("\n---\n"))
    agent_doc["spec"]["scheduler"] = {"classifierModel": "claude-haiku-4-5"}
    session.write_text(json.dumps(agent_doc) + "\n---\n" + json.dumps(session_doc) + "\n")
    state_dir = tmp_path / "state"
    done = subprocess.run(
        run_argv(session, demo_workspace, state_dir, "--scenario", str(scenario)),
        input="the pricing module\n",
        capture_output=True,
        text=True,
        env=run_env(),
        timeout=100,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "? the turn asks: Which module?" in done.stdout
    state = json.loads((state_dir / "state.json").read_text())
    assert state["phase"] == "Succeeded" and state["turns"] == 2
    assert state["repliesRead"] == 1 and state["answer"] == "I will look at pricing."
    assert "turn 2 admitted: the pricing module" in done.stdout


def test_make_demo_scenario_plan_replans_a_missed_step(tmp_path: Path) -> None:
    env = run_env() | {
        "TMPDIR": str(tmp_path),
        "CORRAL_DEMO_STATE_DIR": str(tmp_path / "rec"),
        "SCENARIO": "plan",
    }
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
    assert "↻ 2. Fix total_price so the discount is applied as a percentage [Missed]" in out
    assert "✔ 2. Divide the discount percentage by 100" in out
    assert "Succeeded" in out
    state = json.loads((tmp_path / "rec" / "state.json").read_text())
    assert [s["verdict"] for s in state["plan"]["steps"]] == ["Held", "Held", "Held"]
    assert state["plan"]["steps"][1]["attempts"] == 2
    demo = next(tmp_path.glob("corral-demo.*"))
    assert unittest_passes(session_tree(demo, "corral/fix-discount-plan"))
