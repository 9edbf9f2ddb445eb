"""`corral run` from a repository's root keeps its secrets and state out of git, and commits only
what the agent changed, on the session's branch, leaving the person's branch and files alone."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral_cli import _processes as proc

from .conftest import (
    EXAMPLES,
    FIX,
    corral_argv,
    git,
    run_env,
    session_tree,
    unittest_passes,
    write_session,
)

pytestmark = pytest.mark.timeout(120)

KEY = "sk-ant-canary-7c1e9b3f5d"
BRANCH = "corral/t1"
FIXING = [FIX, {"text": "Fixed the percentage."}]


def _corral(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*corral_argv(), "run", *args], capture_output=True, text=True, cwd=cwd,
        env=env or run_env(), timeout=90,
    )  # fmt: skip


def _outcome(stdout: str) -> dict[str, object]:
    lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    (outcome,) = [x for x in lines if x.get("type") == "outcome"]
    return outcome


@pytest.fixture
async def upstream(tmp_path: Path) -> AsyncIterator[str]:
    """The "Anthropic API" (the scripted model server) that fixes the bug, so the key is used."""
    script = tmp_path / "upstream.json"
    script.write_text(json.dumps({"default": FIXING}))
    parts = proc.Parts(tmp_path / "upstream-logs")
    port = proc.free_port()
    model = parts.start("upstream", proc.scripted_argv(port, script), proc.base_env(), port)
    try:
        await parts.wait_ready(model, "/_requests")
        yield model.url
    finally:
        parts.stop()


def _every_object(workspace: Path) -> str:
    """Every object reachable from every ref, and every path ever committed, as text."""
    listed = git(workspace, "rev-list", "--all", "--objects")
    ids = "\n".join(line.split()[0] for line in listed.splitlines()) + "\n"
    contents = subprocess.run(
        ["git", "cat-file", "--batch"], input=ids, cwd=workspace, capture_output=True,
        text=True, errors="replace", check=True,
    ).stdout  # fmt: skip
    return listed + contents + git(workspace, "log", "-p", "--all")


async def test_a_run_from_the_repository_root_keeps_secrets_and_state_out_of_git(
    upstream: str, demo_workspace: Path, tmp_path: Path, state_home: Path
) -> None:
    ws = demo_workspace
    # The person keeps the session file in the repository, committed, and runs from its root.
    write_session(ws, scenario_replies=[], evaluation=None)
    (ws / "scenario.yaml").unlink()
    git(ws, "add", "session.yaml")
    git(ws, "commit", "-q", "-m", "the session")
    main_before = git(ws, "rev-parse", "main").strip()

    env = run_env() | {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": upstream}
    done = _corral(ws, "-f", "session.yaml", "--workspace", ".", "--json", env=env)
    assert done.returncode == 0, done.stderr + done.stdout[-3000:]
    outcome = _outcome(done.stdout)

    # The state directory is the person's, outside the repository; the secrets are 0600.
    state_dir = Path(str(outcome["stateDir"]))
    assert state_dir.is_relative_to(state_home / "runs")
    secrets_dir = state_dir / "secrets"
    values = {p.name: p.read_text() for p in secrets_dir.iterdir()}
    assert set(values) == {"model-key", "wire-token", "custodian-credential"}
    assert values["model-key"] == KEY
    for path in secrets_dir.iterdir():
        assert os.stat(path).st_mode & 0o777 == 0o600, path
    assert os.stat(secrets_dir).st_mode & 0o077 == 0

    # Nothing of the run in any commit, any object or the working tree.
    history = _every_object(ws)
    for name, value in values.items():
        assert value not in history, name
    for trace in (".corral/", "secrets/", "state.json", "ledger.jsonl", "transcript.jsonl",
                  "wire-token", "custodian.log"):  # fmt: skip
        assert trace not in history, trace
    assert git(ws, "status", "--porcelain", "--ignored") == ""
    assert not (ws / ".corral").exists()

    # The agent's change, alone, on the session branch made from HEAD; main where it was.
    assert git(ws, "branch", "--show-current").strip() == "main"
    assert git(ws, "rev-parse", "main").strip() == main_before
    tip = git(ws, "rev-parse", BRANCH).strip()
    assert git(ws, "rev-list", f"main..{BRANCH}").split() == [tip]
    assert git(ws, "diff", "--name-only", "main", BRANCH).split() == ["shop/pricing.py"]
    assert git(ws, "log", "-1", "--format=%an", BRANCH).strip() == "fixer"
    assert (outcome["branch"], outcome["committed"]) == (BRANCH, tip)
    assert f"committed {tip} on {BRANCH}" in done.stdout
    assert unittest_passes(session_tree(ws, BRANCH))


def test_a_state_dir_inside_the_workspace_is_refused(demo_workspace: Path, tmp_path: Path) -> None:
    session, scenario = write_session(tmp_path, scenario_replies=FIXING, evaluation=None)
    (demo_workspace / "sub").mkdir()
    (tmp_path / "elsewhere").symlink_to(demo_workspace / "sub")
    for state_dir in (demo_workspace / "runs" / "one", tmp_path / "elsewhere" / "run"):
        done = _corral(
            tmp_path, "-f", str(session), "--workspace", str(demo_workspace), "--scenario",
            str(scenario), "--state-dir", str(state_dir),
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert f"--state-dir {state_dir.resolve()} is inside the workspace" in done.stderr
        assert not state_dir.exists()
    assert git(demo_workspace, "branch", "--list", BRANCH) == ""


def test_a_dirty_tree_is_refused_naming_the_files(demo_workspace: Path, tmp_path: Path) -> None:
    session, scenario = write_session(tmp_path, scenario_replies=FIXING, evaluation=None)
    (demo_workspace / "README.md").write_text("the person's unfinished edit\n")
    for i in range(12):
        (demo_workspace / f"note-{i:02d}.txt").write_text("mine\n")
    done = _corral(
        tmp_path, "-f", str(session), "--workspace", str(demo_workspace), "--scenario",
        str(scenario), "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "has uncommitted changes or untracked files: README.md, note-00.txt" in done.stderr
    assert "note-08.txt and 3 more" in done.stderr and "note-09.txt" not in done.stderr
    assert "--allow-dirty" in done.stderr
    assert git(demo_workspace, "branch", "--list", BRANCH) == ""


def test_allow_dirty_runs_and_the_persons_change_stays_out_of_the_agents_commit(
    demo_workspace: Path, tmp_path: Path
) -> None:
    ws = demo_workspace
    session, scenario = write_session(tmp_path, scenario_replies=FIXING, evaluation=None)
    readme = (ws / "README.md").read_text() + "the person's unfinished edit\n"
    (ws / "README.md").write_text(readme)
    (ws / "mine.txt").write_text("not for the agent\n")
    main_before = git(ws, "rev-parse", "main").strip()
    done = _corral(
        tmp_path, "-f", str(session), "--workspace", str(ws), "--scenario", str(scenario),
        "--state-dir", str(tmp_path / "state"), "--allow-dirty",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout[-3000:]
    assert git(ws, "diff", "--name-only", "main", BRANCH).split() == ["shop/pricing.py"]
    assert "unfinished edit" not in git(ws, "show", f"{BRANCH}:README.md")
    assert "mine.txt" not in git(ws, "ls-tree", "-r", "--name-only", BRANCH)
    # The person's work is where they left it, on their branch, which did not move.
    assert (ws / "README.md").read_text() == readme
    assert (ws / "mine.txt").exists()
    assert sorted(git(ws, "status", "--porcelain").splitlines()) == [" M README.md", "?? mine.txt"]
    assert git(ws, "rev-parse", "HEAD").strip() == main_before
    assert "discount_percent / 100" not in (ws / "shop" / "pricing.py").read_text()


def test_the_checked_out_branch_is_never_the_session_branch(
    demo_workspace: Path, tmp_path: Path
) -> None:
    ws = demo_workspace
    git(ws, "checkout", "-q", "-b", "corral/mine")
    session, scenario = write_session(tmp_path, scenario_replies=FIXING, evaluation=None)
    named = '"repo": "unused", "branch": "corral/mine"'
    session.write_text(session.read_text().replace('"repo": "unused"', named))
    done = _corral(
        tmp_path, "-f", str(session), "--workspace", str(ws), "--scenario", str(scenario),
        "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "spec.workspace.branch 'corral/mine' is the branch checked out in" in done.stderr


def test_examples_run_unchanged_from_elsewhere(tmp_path: Path, state_home: Path) -> None:
    """Without --workspace the Session's repo is cloned under the default state directory."""
    done = _corral(tmp_path, "-f", str(EXAMPLES / "session.yaml"), "--json")
    assert done.returncode == 0, done.stderr + done.stdout[-3000:]
    outcome = _outcome(done.stdout)
    state_dir = Path(str(outcome["stateDir"]))
    assert state_dir.parent == state_home / "runs"
    workspace = state_dir / "workspace"
    assert outcome["committed"] == git(workspace, "rev-parse", "corral/fix-discount").strip()
    assert list(tmp_path.iterdir()) == [tmp_path / "xdg-state"]  # nothing in the cwd
