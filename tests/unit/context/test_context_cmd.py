"""`corral context`: what the model would see, as JSON and as text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from corral_cli.context_cmd import main

MANIFESTS = """\
apiVersion: corral.dev/v1alpha1
kind: Agent
metadata: {name: fixer}
spec:
  identity: You are a careful engineer.
  instructions: Never edit a test to make it pass.
  model: claude-sonnet-4-5
  tools: {allow: ["*"], deny: ["bash"]}
---
apiVersion: corral.dev/v1alpha1
kind: Session
metadata: {name: fix-it}
spec:
  agentRef: fixer
  task: Fix the negative discount.
  readOnly: READONLY
  workspace: {repo: demo/repo}
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    workspace = tmp_path / "ws"
    (workspace / "pkg").mkdir(parents=True)
    (workspace / "AGENTS.md").write_text("Run the unit tests.")
    (workspace / "pkg" / "AGENTS.md").write_text("pkg: prices are floats." + " x" * 400)
    session = tmp_path / "session.yaml"
    session.write_text(MANIFESTS.replace("READONLY", "false"))
    return session, workspace


def test_json_shows_every_layer_and_the_prompt(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    session, workspace = files
    assert main(["-f", str(session), "--workspace", str(workspace), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [layer["name"] for layer in report["layers"]] == [
        "identity",
        "instruction_files",
        "project_context",
        "business_rules",
        "task_state",
    ]
    for layer in report["layers"]:
        assert set(layer) >= {"name", "tokens", "estimated", "strategy", "kept", "dropped"}
    files_layer = report["layers"][1]
    assert files_layer["kept"] == ["AGENTS.md", "pkg/AGENTS.md", "agent:instructions"]
    assert (
        "Never edit a test" in report["prompt"] and "Fix the negative discount." in report["prompt"]
    )
    assert "bash" not in report["tools"] and "read" in report["tools"]
    assert report["messages"][0]["content"][0]["text"] == "Fix the negative discount."


def test_budget_overrides_show_what_was_dropped(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    session, workspace = files
    argv = ["-f", str(session), "--workspace", str(workspace), "--budget", "instruction_files=30"]
    assert main([*argv, "--json"]) == 0
    layer = json.loads(capsys.readouterr().out)["layers"][1]
    assert layer["dropped"] == ["pkg/AGENTS.md"] and layer["tokens"] <= 30
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "dropped: pkg/AGENTS.md" in text and "----- system prompt -----" in text


def test_read_only_session_hides_writers(
    tmp_path: Path, files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, workspace = files
    session = tmp_path / "ro.yaml"
    session.write_text(MANIFESTS.replace("READONLY", "true"))
    assert main(["-f", str(session), "--workspace", str(workspace), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tools"] == ["tool_search", "read", "grep", "glob"]
    assert "read-only" in report["prompt"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget", "tools=5"], "unknown context layer 'tools'"),
        (["--budget", "identity=lots"], "expected LAYER=TOKENS"),
    ],
)
def test_bad_input_is_a_clear_error(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    session, workspace = files
    assert main(["-f", str(session), "--workspace", str(workspace), *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_agent_or_workspace_is_a_clear_error(
    tmp_path: Path, files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    session, workspace = files
    only_session = tmp_path / "only" / "s.yaml"
    only_session.parent.mkdir()
    only_session.write_text(MANIFESTS.split("---\n", 1)[1].replace("READONLY", "false"))
    assert main(["-f", str(only_session), "--workspace", str(workspace)]) == 2
    assert '"fixer" not found' in capsys.readouterr().err
    assert main(["-f", str(session), "--workspace", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_the_corral_command_dispatches_to_it(files: tuple[Path, Path]) -> None:
    session, workspace = files
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral_cli.main",
            "context",
            "-f",
            str(session),
            "--workspace",
            str(workspace),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["layers"][0]["name"] == "identity"
