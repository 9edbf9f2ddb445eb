"""The models validate locally the way the API server does."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from corral_api import AgentSpec, Session
from corral_api.wire import WireUsage


def test_agent_defaults() -> None:
    spec = AgentSpec.model_validate({"identity": "x", "model": "claude-sonnet-4-5"})
    assert spec.thinking_level == "medium"
    assert spec.limits.max_depth == 3
    assert spec.limits.max_children_per_turn == 5
    assert spec.limits.max_output_tokens == 32000
    assert spec.tools.allow == [] and spec.tools.deny == []


@pytest.mark.parametrize(
    ("patch", "loc"),
    [
        ({"limits": {"maxDepth": 4}}, ("limits", "maxDepth")),
        ({"limits": {"maxOutputTokens": 40000}}, ("limits", "maxOutputTokens")),
        ({"thinkingLevel": "huge"}, ("thinkingLevel",)),
        ({"surprise": 1}, ("surprise",)),
    ],
)
def test_agent_rejects_with_field_location(patch: dict[str, object], loc: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError) as err:
        AgentSpec.model_validate({"identity": "x", "model": "m", **patch})
    assert tuple(err.value.errors()[0]["loc"]) == loc


def test_session_round_trips_in_wire_spelling() -> None:
    doc = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": "s"},
        "spec": {
            "agentRef": "a",
            "task": "t",
            "workspace": {"repo": "r"},
            "ttlSecondsAfterFinished": 60,
        },
    }
    session = Session.model_validate(doc)
    assert session.spec.ttl_seconds_after_finished == 60
    assert session.spec.workspace.granted_root == "/workspace"
    wire = session.wire()
    assert wire["spec"]["ttlSecondsAfterFinished"] == 60
    assert wire["spec"]["workspace"]["grantedRoot"] == "/workspace"


def test_usage_adds() -> None:
    total = WireUsage(input=1, output=2, cost=0.5) + WireUsage(input=3, cacheRead=4, cost=0.25)
    assert (total.input, total.output, total.cacheRead, total.cost) == (4, 2, 4, 0.75)
