"""`corral run` honours the hooks of the Agent YAML it is given: a veto, and the session's start
and end, with the real harness, custodian, scripted model and driver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import corral_run, git, write_session

pytestmark = pytest.mark.timeout(120)


def test_corral_run_runs_the_agents_hooks_from_start_to_end(
    demo_workspace: Path, tmp_path: Path
) -> None:
    session, scenario = write_session(
        tmp_path,
        evaluation=None,
        scenario_replies=[
            {"tool_use": {"name": "bash", "input": {"command": "rm -rf shop"}}},
            {"text": "I will leave the files alone."},
        ],
    )
    log = tmp_path / "hooks.log"
    record = f'python3 -c \'import json,sys; e=json.load(sys.stdin); print(e["phase"], e.get("sessionPhase", "-"))\' >> {log}'  # noqa: E501
    veto = (
        "if grep -q 'rm -rf'; then "
        'echo \'{"decision": "deny", "reason": "no rm -rf here", "continue": true}\'; fi'
    )
    agent, rest = session.read_text().split("\n---\n", 1)
    spec = json.loads(agent)
    spec["spec"]["hooks"] = {
        "sessionStart": [{"name": "open", "command": record}],
        "beforeTool": [{"name": "veto", "matcher": ["bash"], "command": veto}],
        "sessionEnd": [{"name": "close", "command": record}],
    }
    session.write_text(json.dumps(spec) + "\n---\n" + rest)

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
    # The veto held: the session's branch (the agent's working copy) still has the files.
    assert "shop/pricing.py" in git(demo_workspace, "ls-tree", "-r", "--name-only", "corral/t1")
    assert log.read_text() == "sessionStart -\nsessionEnd Succeeded\n"
    # The model read the veto's reason as the call's result.
    assert "no rm -rf here" in (done.state_dir / "transcript.jsonl").read_text()
