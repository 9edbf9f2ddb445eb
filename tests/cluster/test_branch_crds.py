"""Protected branches in the CRDs, on a real kube-apiserver: an Agent's branch patterns and
landing targets are checked for syntax, and a Session (or a Goal's template) that sets landing
targets is refused with a message a person understands."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral_dev.controlplane import ControlPlane

from .test_crds import AGENT, GOAL, SESSION, _create, _with

# The message as the API server prints it: YAML-folded lines joined back, quotes as given.
TARGETS_WORDS = [
    "spec.landing.targets",
    "landing targets are set on the Agent only (Agent spec.landing.targets)",
    "a Session may replace its Agent's landing check, but never where land may reach",
]

INVALID: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "session-landing-targets",
        _with(SESSION, "spec.landing", {"targets": ["main"]}),
        TARGETS_WORDS,
    ),
    (
        "session-landing-targets-beside-a-check",
        _with(SESSION, "spec.landing", {"check": {"name": "u", "command": "t"}, "targets": []}),
        TARGETS_WORDS,
    ),
    (
        "goal-template-landing-targets",
        _with(GOAL, "spec.sessionTemplate.spec.landing", {"targets": ["**"]}),
        ["spec.sessionTemplate.spec.landing.targets", "set on the Agent only"],
    ),
    (
        "agent-branch-pattern-full-ref",
        _with(AGENT, "spec.workspace", {"branches": ["corral/**", "refs/heads/main"]}),
        ["spec.workspace.branches[1]", "must be a branch-name pattern"],
    ),
    (
        "agent-branch-pattern-dotdot",
        _with(AGENT, "spec.workspace", {"branches": ["corral/../main"]}),
        ["spec.workspace.branches[0]", "must be a branch-name pattern"],
    ),
    (
        "agent-branch-pattern-three-stars",
        _with(AGENT, "spec.workspace", {"branches": ["***"]}),
        ["spec.workspace.branches[0]", "must be a branch-name pattern"],
    ),
    (
        "agent-no-branch-patterns",
        _with(AGENT, "spec.workspace", {"branches": []}),
        ["spec.workspace.branches", "should have at least 1 items"],
    ),
    (
        "agent-landing-target-head",
        _with(AGENT, "spec.landing", {"targets": ["HEAD"]}),
        ["spec.landing.targets[0]", "must be a branch-name pattern"],
    ),
]


@pytest.mark.parametrize(("case", "obj", "words"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_branch_fields_are_rejected_naming_the_field(
    control_plane: ControlPlane, namespace: str, case: str, obj: dict[str, Any], words: list[str]
) -> None:
    code, out = _create(control_plane, namespace, obj)
    assert code != 0, f"{case} was accepted"
    flat = " ".join(out.split())
    for word in words:
        assert word in flat, f"{case}: {word!r} not in API server message:\n{out}"


def test_an_agents_patterns_and_targets_are_accepted_and_kept(
    control_plane: ControlPlane, namespace: str
) -> None:
    agent = _with(
        _with(AGENT, "spec.workspace", {"branches": ["corral/**", "bot/*", "release-*"]}),
        "spec.landing",
        {"targets": ["main", "release/**"], "check": {"name": "unit", "command": "make test"}},
    )
    agent["metadata"] = {"name": "patterned"}
    code, out = _create(control_plane, namespace, agent)
    assert code == 0, out
    # A Session may still replace the landing check; only the targets are the Agent's.
    session = _with(SESSION, "spec.landing", {"check": {"name": "own", "command": "true"}})
    session["metadata"] = {"name": "own-check"}
    code, out = _create(control_plane, namespace, session)
    assert code == 0, out
    got = json.loads(
        control_plane.kubectl("get", "agent", "patterned", "-n", namespace, "-o", "json").stdout
    )
    assert got["spec"]["workspace"]["branches"] == ["corral/**", "bot/*", "release-*"]
    assert got["spec"]["landing"]["targets"] == ["main", "release/**"]
