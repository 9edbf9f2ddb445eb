"""Run the real `corral run`: real harness, custodian and scripted model processes, real git,
real files. Only ANTHROPIC_API_KEY is removed, so the scripted model plays the scenario."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DEMO_REPO = EXAMPLES / "demo" / "repo"


def corral_argv() -> list[str]:
    script = Path(sys.executable).parent / "corral"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from corral_cli.main import main; sys.exit(main())"]


def run_argv(session: Path, workspace: Path, state_dir: Path, *extra: str) -> list[str]:
    """`corral run -f SESSION --workspace WS ... --state-dir DIR` as the tests start it."""
    return [
        *corral_argv(),
        "run",
        "-f",
        str(session),
        "--workspace",
        str(workspace),
        *extra,
        "--state-dir",
        str(state_dir),
    ]


def run_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CORRAL_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def git(workspace: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
        cwd=workspace,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`corral run`'s default state home (runs, memory) for this test only: never the real
    ~/.local/state."""
    home = tmp_path / "xdg-state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home / "corral"


def session_tree(workspace: Path, branch: str) -> Path:
    """The session branch checked out beside `workspace` (a worktree), to run its tests."""
    where = workspace.parent / f"{workspace.name}-{branch.replace('/', '-')}"
    git(workspace, "worktree", "add", "-q", "--detach", str(where), branch)
    return where


@pytest.fixture
def demo_workspace(tmp_path: Path) -> Path:
    workspace = tmp_path / "workspace"
    shutil.copytree(DEMO_REPO, workspace, ignore=shutil.ignore_patterns("__pycache__"))
    git(workspace, "init", "-q", "-b", "main")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "before")
    return workspace


def unittest_passes(workspace: Path) -> bool:
    result = subprocess.run(
        [sys.executable, "-m", "unittest", "-q"],
        cwd=workspace,
        capture_output=True,
        env=run_env(),
    )
    return result.returncode == 0


@dataclass
class Finished:
    code: int
    stdout: str
    stderr: str
    state_dir: Path

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]

    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads((self.state_dir / "state.json").read_text())
        return result

    def ledger(self) -> list[dict[str, Any]]:
        return read_lines(self.state_dir / "ledger.jsonl")

    def transcript(self) -> list[dict[str, Any]]:
        return read_lines(self.state_dir / "transcript.jsonl")


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def corral_run(*args: str, state_dir: Path, timeout: float = 90) -> Finished:
    result = subprocess.run(
        [*corral_argv(), "run", *args, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        env=run_env(),
        timeout=timeout,
        cwd=state_dir.parent,
    )
    return Finished(result.returncode, result.stdout, result.stderr, state_dir)


def write_session(
    directory: Path,
    *,
    scenario_replies: list[Any],
    evaluation: dict[str, Any] | None,
    name: str = "t1",
) -> tuple[Path, Path]:
    """A Session + Agent file and a scenario file for the scripted model."""
    spec: dict[str, Any] = {
        "agentRef": "fixer",
        "task": "Make the tests pass.",
        "workspace": {"repo": "unused"},
    }
    if evaluation is not None:
        spec["evaluation"] = evaluation
    agent = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "fixer"},
        "spec": {
            "identity": "You fix bugs.",
            "model": "claude-sonnet-4-5",
            "tools": {"allow": ["read", "edit", "bash"]},
            "limits": {"maxTurns": 5},
        },
    }
    session = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": name},
        "spec": spec,
    }
    session_file = directory / "session.yaml"
    session_file.write_text(json.dumps(agent) + "\n---\n" + json.dumps(session) + "\n")
    scenario = directory / "scenario.yaml"
    scenario.write_text(json.dumps({"default": scenario_replies}))
    return session_file, scenario


FIX = {
    "tool_use": {
        "name": "edit",
        "input": {
            "path": "shop/pricing.py",
            "old_string": "    discount = subtotal * discount_percent\n",
            "new_string": "    discount = subtotal * discount_percent / 100\n",
        },
    }
}
