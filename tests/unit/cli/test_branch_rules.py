"""`corral run` holds a Session to its Agent's branch patterns and refuses landing targets on
a Session, in the API server's words (the CRDs' own messages)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from corral_api.kinds import BRANCH_PATTERN_MESSAGE, KINDS, LANDING_TARGETS_MESSAGE
from corral_cli._manifests import (
    ManifestError,
    check_session_branch,
    load_manifests,
    pick_session,
    validate_resource,
)
from corral_cli.run_cmd import EXIT_INVALID, run_command

AGENT: dict[str, Any] = {
    "apiVersion": "corral.dev/v1alpha1",
    "kind": "Agent",
    "metadata": {"name": "fixer"},
    "spec": {"identity": "x", "model": "claude-sonnet-4-5"},
}


def _session(**spec: object) -> dict[str, Any]:
    base: dict[str, object] = {"agentRef": "fixer", "task": "fix it", "workspace": {"repo": "r"}}
    base.update(spec)
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": "s1"},
        "spec": base,
    }


def _refusal(doc: object) -> str:
    with pytest.raises(ManifestError) as caught:
        validate_resource(doc, "test.yaml")
    return str(caught.value)


def test_a_session_may_not_set_landing_targets() -> None:
    doc = _session(landing={"targets": ["main"]})
    assert f'spec.landing.targets: Invalid value: "object": {LANDING_TARGETS_MESSAGE}' in _refusal(
        doc
    )
    # Its own landing check is still the Session's to set.
    validate_resource(_session(landing={"check": {"name": "unit", "command": "true"}}), "ok")


@pytest.mark.parametrize("bad", ["refs/heads/main", "HEAD", "a..b", "x/", "-x", "a***", "a b"])
def test_a_bad_branch_pattern_is_refused_naming_its_index(bad: str) -> None:
    for field in ("workspace", "landing"):
        key = "branches" if field == "workspace" else "targets"
        doc = {**AGENT, "spec": {**AGENT["spec"], field: {key: ["corral/**", bad]}}}
        expected = f'spec.{field}.{key}[1]: Invalid value: "string": {BRANCH_PATTERN_MESSAGE}'
        assert expected in _refusal(doc)


def test_good_patterns_pass() -> None:
    spec = {
        **AGENT["spec"],
        "workspace": {"branches": ["corral/**", "bot/*", "release-*"]},
        "landing": {"targets": ["main", "release/**"]},
    }
    validate_resource({**AGENT, "spec": spec}, "ok")


def test_the_messages_are_the_crds() -> None:
    messages: set[str] = set()

    def collect(node: object) -> None:
        if isinstance(node, dict):
            messages.update(r["message"] for r in node.get("x-kubernetes-validations", []))
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    for kind in KINDS:
        collect(kind.model_json_schema(by_alias=True))
    assert {BRANCH_PATTERN_MESSAGE, LANDING_TARGETS_MESSAGE} <= messages


def _files(tmp_path: Path, branch: str | None, agent_extra: str = "") -> Path:
    workspace = "{repo: r" + (f", branch: {branch}" if branch else "") + "}"
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent(f"""
        apiVersion: corral.dev/v1alpha1
        kind: Agent
        metadata: {{name: fixer}}
        spec: {{identity: x, model: claude-sonnet-4-5{agent_extra}}}
        ---
        apiVersion: corral.dev/v1alpha1
        kind: Session
        metadata: {{name: s1}}
        spec: {{agentRef: fixer, task: t, workspace: {workspace}}}
        """)
    )
    return path


def test_check_session_branch(tmp_path: Path) -> None:
    session, agent = pick_session(load_manifests([_files(tmp_path, "main")]))
    with pytest.raises(ManifestError, match=r"spec\.workspace\.branch 'main' is outside"):
        check_session_branch(session, agent)
    session, agent = pick_session(load_manifests([_files(tmp_path, None)]))
    check_session_branch(session, agent)  # corral/s1 under the default corral/**
    narrow = ", workspace: {branches: ['bot/*']}"
    session, agent = pick_session(load_manifests([_files(tmp_path, None, narrow)]))
    with pytest.raises(ManifestError, match="the default corral/s1 applies"):
        check_session_branch(session, agent)


def test_corral_run_refuses_a_session_on_main_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _files(tmp_path, "main")
    state = tmp_path / "state"
    code = run_command(["-f", str(path), "--state-dir", str(state)])
    assert code == EXIT_INVALID == 2
    err = capsys.readouterr().err
    assert "spec.workspace.branch 'main' is outside Agent 'fixer'" in err
    assert "corral/**" in err
    assert not state.exists()
