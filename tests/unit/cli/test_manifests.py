"""Bad YAML gets the API server's field-named messages; the CEL rules are checked locally too."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from corral_api.kinds import BRANCH_MESSAGE, KINDS, EvaluationCriteria, SessionSpec, Workspace
from corral_cli import _rules
from corral_cli._manifests import (
    ManifestError,
    api_server_message,
    load_manifests,
    pick_session,
    validate_resource,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

AGENT: dict[str, Any] = {
    "apiVersion": "corral.dev/v1alpha1",
    "kind": "Agent",
    "metadata": {"name": "fixer"},
    "spec": {"identity": "x", "model": "claude-sonnet-4-5"},
}


def session(**spec: object) -> dict[str, Any]:
    base: dict[str, object] = {"agentRef": "fixer", "task": "fix it", "workspace": {"repo": "r"}}
    base.update(spec)
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": "s1"},
        "spec": base,
    }


def refusal(doc: object) -> str:
    with pytest.raises(ManifestError) as caught:
        validate_resource(doc, "test.yaml")
    return str(caught.value)


def test_a_limit_above_its_cap_names_the_field_value_and_bound() -> None:
    doc = {**AGENT, "spec": {**AGENT["spec"], "orchestrator": True, "limits": {"maxDepth": 7}}}
    assert refusal(doc) == (
        'The Agent "fixer" is invalid: spec.limits.maxDepth: Invalid value: 7: '
        "spec.limits.maxDepth in body should be less than or equal to 3"
    )


def test_several_problems_are_listed_one_per_line() -> None:
    doc = session(task="", overrides={"thinkingLevel": "extreme"})
    text = refusal(doc)
    assert text.splitlines()[0] == 'The Session "s1" is invalid:'
    assert '* spec.task: Invalid value: "": spec.task in body should be at least 1 chars long' in (
        text
    )
    assert (
        '* spec.overrides.thinkingLevel: Unsupported value: "extreme": supported values: '
        '"low", "medium", "high"' in text
    )


def test_unknown_fields_are_refused_before_anything_else_is_checked() -> None:
    doc = session(task="", zebra=1, surprise=2)
    assert refusal(doc) == (
        'Session in version "v1alpha1" cannot be handled as a Session: strict decoding error: '
        'unknown field "spec.surprise", unknown field "spec.zebra"'
    )


def test_missing_and_mistyped_fields() -> None:
    doc = session(ttlSecondsAfterFinished="3")
    del doc["spec"]["task"]
    text = refusal(doc)
    assert "* spec.task: Required value" in text
    # The API server does not turn "3" into 3; neither does corral run.
    assert (
        '* spec.ttlSecondsAfterFinished: Invalid value: "string": spec.ttlSecondsAfterFinished '
        'in body must be of type integer: "string"' in text
    )


def test_pattern_and_list_index_paths() -> None:
    doc = session(agentRef="Not_A_Name")
    assert (
        'spec.agentRef: Invalid value: "Not_A_Name": spec.agentRef in body should match '
        "'^[a-z0-9]" in refusal(doc)
    )
    agent = {**AGENT, "spec": {**AGENT["spec"], "tools": {"allow": ["bash", 3]}}}
    assert (
        'spec.tools.allow[1]: Invalid value: "integer": spec.tools.allow[1] in body must be of '
        'type string: "integer"' in refusal(agent)
    )


def test_metadata_name_is_required_and_checked() -> None:
    doc = {**AGENT, "metadata": {}}
    assert "metadata.name: Required value" in refusal(doc)
    doc = {**AGENT, "metadata": {"name": "Bad Name"}}
    assert 'metadata.name: Invalid value: "Bad Name"' in refusal(doc)


def test_unknown_kind_or_version_is_refused_like_kubectl() -> None:
    doc = {**AGENT, "kind": "Agnet"}
    assert 'no matches for kind "Agnet" in version "corral.dev/v1alpha1"' in refusal(doc)
    doc = {**AGENT, "apiVersion": "corral.dev/v1"}
    assert 'no matches for kind "Agent" in version "corral.dev/v1"' in refusal(doc)


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            session(evaluation={"criteria": {"substring": "x", "command": "y"}}),
            'spec.evaluation.criteria: Invalid value: "object": '
            "set exactly one of substring or command",
        ),
        (
            session(evaluation={"criteria": {}}),
            'spec.evaluation.criteria: Invalid value: "object": '
            "set exactly one of substring or command",
        ),
        (
            session(readOnly=True, workspace={"repo": "r", "branch": "corral/x"}),
            'spec.workspace.branch: Invalid value: "object": '
            "a read-only session cannot have a branch to push to",
        ),
        (
            session(workspace={"repo": "r", "branch": "../evil"}),
            'spec.workspace.branch: Invalid value: "string": must be a valid git branch name',
        ),
        (
            session(workspace={"repo": "r", "grantedRoot": "/workspace/../etc"}),
            'spec.workspace.grantedRoot: Invalid value: "string": '
            "must be /workspace or a path below it, without '..'",
        ),
        (
            session(workspace={"repo": "r", "grantedRoot": "/opt/corral/bin"}),
            'spec.workspace.grantedRoot: Invalid value: "string": '
            "must be /workspace or a path below it",
        ),
    ],
)
def test_session_cel_rules(doc: dict[str, object], expected: str) -> None:
    assert expected in refusal(doc)


def test_agent_cel_rules() -> None:
    both = {**AGENT, "spec": {**AGENT["spec"], "tools": {"allow": ["bash"], "deny": ["bash"]}}}
    assert (
        'spec.tools: Invalid value: "object": a tool pattern cannot be in both tools.allow '
        "and tools.deny" in refusal(both)
    )
    leaf = {**AGENT, "spec": {**AGENT["spec"], "limits": {"maxDepth": 2}}}
    assert 'spec.limits.maxDepth: Invalid value: "object": limits.maxDepth only applies' in (
        refusal(leaf)
    )


def test_every_local_rule_message_is_one_of_the_crds() -> None:
    """The local checks word their failures with the CRDs' own messages, so they cannot drift."""
    messages: set[str] = set()

    def collect(node: object) -> None:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations", []):
                messages.add(rule["message"])
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    for kind in KINDS:
        collect(kind.model_json_schema(by_alias=True))
    local = {
        _rules._rule_message(SessionSpec, "readOnly"),
        _rules._rule_message(EvaluationCriteria, "has(self.substring)"),
        _rules._field_rule_message(Workspace, "granted_root"),
        BRANCH_MESSAGE,
    }
    assert local <= messages


def test_api_server_message_falls_back_to_pydantics_words() -> None:
    error = {"type": "weird", "loc": ("spec", "x"), "input": 1, "msg": "odd"}
    assert api_server_message(error) == "spec.x: Invalid value: 1: odd"


def test_yaml_syntax_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Session\n  spec: [unclosed\n")
    with pytest.raises(ManifestError, match=r"error parsing .*bad\.yaml"):
        load_manifests([bad])


def test_the_examples_are_valid_and_the_agent_is_found_next_to_the_session() -> None:
    found = load_manifests([EXAMPLES / "session.yaml"])
    assert not found.agents
    chosen, agent = pick_session(found, [EXAMPLES])
    assert chosen.metadata["name"] == "fix-discount"
    assert agent.metadata["name"] == chosen.spec.agent_ref


def test_a_session_whose_agent_is_nowhere_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        textwrap.dedent("""
        apiVersion: corral.dev/v1alpha1
        kind: Session
        metadata: {name: lonely}
        spec: {agentRef: ghost, task: t, workspace: {repo: r}}
    """)
    )
    with pytest.raises(ManifestError, match=r'agents\.corral\.dev "ghost" not found'):
        pick_session(load_manifests([path]), [tmp_path])


def test_one_session_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    one = "apiVersion: corral.dev/v1alpha1\nkind: Session\nmetadata: {name: %s}\n"
    one += "spec: {agentRef: a, task: t, workspace: {repo: r}}\n"
    path.write_text(one % "a" + "---\n" + one % "b")
    with pytest.raises(ManifestError, match="one Session at a time"):
        pick_session(load_manifests([path]))
