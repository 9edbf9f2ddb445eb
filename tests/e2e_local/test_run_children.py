"""`corral run` runs an orchestrator's children as local processes, by the cluster's rules
(docs/children.md): each child its own harness and custodian, its own clone and branch from
its parent's working copy; a parent waits by its wait mode and reads one line per child; a
child never gets more turns than its parent has left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import corral_run, git, read_lines

pytestmark = pytest.mark.timeout(240)

ROOT, MID, LEAF = "tree", "tree-child-?????", "tree-child-?????-child-?????"


def _bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "bash", "input": {"command": command}}}


def _menu(name: str, **tool_input: Any) -> dict[str, Any]:
    return {"tool_use": {"name": f"mcp__corral__{name}", "input": tool_input}}


def _files(tmp: Path, conversations: dict[str, Any], max_turns: int) -> tuple[Path, Path, Path]:
    """A workspace repository, a Session + orchestrator Agent file, and a scenario."""
    workspace = tmp / "workspace"
    workspace.mkdir()
    (workspace / "README.md").write_text("# tree\n")
    git(workspace, "init", "-q", "-b", "main")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "start")
    agent = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "boss"},
        "spec": {
            "identity": "You lead.",
            "model": "claude-sonnet-4-5",
            "orchestrator": True,
            "tools": {"allow": ["bash", "mcp__corral__*"]},
            "limits": {"maxTurns": max_turns},
        },
    }
    session = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": ROOT},
        "spec": {"agentRef": "boss", "task": "Split the work.", "workspace": {"repo": "unused"}},
    }
    session_file = tmp / "session.yaml"
    session_file.write_text(json.dumps(agent) + "\n---\n" + json.dumps(session) + "\n")
    scenario = tmp / "scenario.yaml"
    scenario.write_text(json.dumps({"conversations": conversations}))
    return workspace, session_file, scenario


def _run(tmp: Path, workspace: Path, session: Path, scenario: Path) -> Any:
    return corral_run(
        "-f", str(session), "--workspace", str(workspace), "--scenario", str(scenario),
        state_dir=tmp / "state", timeout=200,
    )  # fmt: skip


def _doc(state: Path, name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((state / "sessions" / f"{name}.json").read_text())
    return result


def _children(state: Path, uid: str) -> list[dict[str, Any]]:
    docs = [json.loads(p.read_text()) for p in sorted((state / "sessions").glob("*.json"))]
    return [d for d in docs if (d["spec"].get("parentRef") or {}).get("uid") == uid]


def _admissions(ledger: Path) -> list[str]:
    return [r["message"] for r in read_lines(ledger) if r["kind"] == "admission"]


def test_a_three_level_tree_runs_locally_and_each_parent_reads_one_line_per_child(
    tmp_path: Path,
) -> None:
    workspace, session, scenario = _files(
        tmp_path,
        {
            ROOT: [
                _bash("echo from-root > root.txt"),
                _menu("spawn_child", task="Middle: build on the root's work."),
                {"text": "Spawned the middle session."},
                {"text": "All children are done."},
            ],
            MID: [
                _bash("cat root.txt && echo from-mid > mid.txt"),
                _menu("spawn_child", task="Leaf: finish it."),
                _menu("wait_children", mode="first"),
                {"text": "Middle done after the leaf."},
            ],
            LEAF: [
                _bash("cat root.txt mid.txt && echo from-leaf > leaf.txt"),
                {"text": "Leaf done: saw both files."},
            ],
        },
        max_turns=4,
    )
    done = _run(tmp_path, workspace, session, scenario)
    assert done.code == 0, done.stdout[-4000:] + done.stderr[-4000:]
    state = done.state_dir
    root = done.state()
    assert root["phase"] == "Succeeded" and root["turns"] == 2, root

    (mid,) = _children(state, _doc(state, ROOT)["metadata"]["uid"])
    mid_name = mid["metadata"]["name"]
    (leaf,) = _children(state, mid["metadata"]["uid"])
    leaf_name = leaf["metadata"]["name"]
    assert mid["status"]["phase"] == leaf["status"]["phase"] == "Succeeded"
    assert mid["status"]["turns"] == 2 and leaf["status"]["turns"] == 1
    assert root["reportedChildren"] == [mid_name]
    assert mid["status"]["reportedChildren"] == [leaf_name]
    # The middle session waited by the mode it asked for; the root by the default, all.
    assert mid["status"]["waitingFor"]["mode"] == "first"
    assert root["waitingFor"]["mode"] == "all"

    # Each child started from its parent's working copy at the spawn: the parent's commit.
    root_spawn = mid["spec"]["workspace"]["ref"]
    assert git(workspace, "show", f"{root_spawn}:root.txt").strip() == "from-root"
    mid_spawn = leaf["spec"]["workspace"]["ref"]
    # Every branch is in the root's repository; each child's commit sits on its parent's.
    leaf_rev = git(workspace, "rev-parse", f"corral/{leaf_name}").strip()
    mid_rev = git(workspace, "rev-parse", f"corral/{mid_name}").strip()
    assert leaf["status"]["delivery"]["revision"] == leaf_rev
    assert mid["status"]["delivery"]["revision"] == mid_rev
    assert git(workspace, "rev-parse", f"{leaf_rev}^").strip() == mid_spawn == mid_rev
    assert git(workspace, "rev-parse", f"{mid_rev}^").strip() == root_spawn
    assert git(workspace, "show", f"{leaf_rev}:leaf.txt").strip() == "from-leaf"
    assert git(workspace, "show", f"{leaf_rev}:mid.txt").strip() == "from-mid"
    # The root's own directory is not the children's: it never got their files.
    assert not (workspace / "mid.txt").exists() and not (workspace / "leaf.txt").exists()

    # One line per child, sewn into the parent's next turn: name, outcome, answer, branch, sha.
    mid_resume = _admissions(state / "children" / mid_name / "ledger.jsonl")[-1]
    assert "wait mode: first" in mid_resume
    assert (
        f"- child {leaf_name}: Succeeded: Leaf done: saw both files. "
        f"(pushed corral/{leaf_name} at {leaf_rev})"
    ) in mid_resume
    root_resume = _admissions(state / "ledger.jsonl")[-1]
    assert root_resume.count("- child ") == 1
    assert (
        f"- child {mid_name}: Succeeded: Middle done after the leaf. "
        f"(pushed corral/{mid_name} at {mid_rev})"
    ) in root_resume
    # The live view showed the children, each line under its name.
    assert f"[{leaf_name}] child session started" in done.stdout
    assert f"[{mid_name}] turn 2 admitted" in done.stdout


def test_a_child_gets_no_more_turns_than_its_parent_has_left(tmp_path: Path) -> None:
    workspace, session, scenario = _files(
        tmp_path,
        {
            ROOT: [
                _menu("spawn_child", task="Try hard.", maxTurns=9, criteria="NEVER-SAID"),
                {"text": "Spawned."},
                {"text": "The child ran out of turns."},
            ],
            MID: [{"text": "nope"}, {"text": "still nope"}, {"text": "a third turn"}],
        },
        max_turns=2,
    )
    done = _run(tmp_path, workspace, session, scenario)
    assert done.code == 0, done.stdout[-4000:] + done.stderr[-4000:]
    state = done.state_dir
    (child,) = _children(state, _doc(state, ROOT)["metadata"]["uid"])
    name = child["metadata"]["name"]
    # It asked for 9; its parent had 2 left (the turn in flight counts): 2 it got, and used.
    spawned = [
        e for e in read_lines(state / "transcript.jsonl")
        if e.get("type") == "tool_end" and str(e.get("name", "")).endswith("spawn_child")
    ]  # fmt: skip
    answer = json.loads(spawned[0]["result"])
    assert answer["child"] == name and answer["maxTurns"] == 2
    assert child["metadata"]["annotations"]["corral.dev/max-turns"] == "2"
    # Its cap is derived when it starts, from what the parent has left then: 2 while the
    # parent's first turn is in flight, 1 once it settled (the parent keeps one to read the
    # report); never the 9 it asked for. It used every turn it got and failed its criteria.
    status = child["status"]
    turns = status["turns"]
    assert status["phase"] == "Failed" and turns in (1, 2), status
    # Whichever cap bound first says so: the agent's turn limit, or the evaluation guard's
    # budget of the same number of turns (which one depends on when the parent settled).
    assert (
        f"the agent's limit of {turns} turns is reached" in status["message"]
        or f"its turn budget of {turns} is spent" in status["message"]
    ), status
    assert len(_admissions(state / "children" / name / "ledger.jsonl")) == turns
    root_resume = _admissions(state / "ledger.jsonl")[-1]
    assert f"- child {name}: Failed: " in root_resume
