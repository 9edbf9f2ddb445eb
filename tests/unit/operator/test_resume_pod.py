"""The new pod of a Session that lost its own (docs/turns.md, "A lost pod"): checked out at the
delivered revision, its custodian's record seeded with what the Session had spent and with
what its lost custodian had carved for its children (their spec.budget, summed), so a resumed
Session can neither spend nor give away again what is already gone."""

from __future__ import annotations

import json
from typing import Any

from corral_operator.builders.podbuilder import build_pod, carved_for
from corral_operator.session.sandbox import resume_point
from corral_operator.settings import OperatorSettings
from tests._objects import agent, session, session_body


def _custodian_env(pod: dict[str, Any]) -> dict[str, Any]:
    [custodian] = [c for c in pod["spec"]["containers"] if c["name"] == "custodian"]
    return {e["name"]: e.get("value") for e in custodian["env"]}


def _child(tokens: int | None, cost: float | None) -> dict[str, Any]:
    budget: dict[str, Any] = {}
    if tokens is not None:
        budget["tokens"] = tokens
    if cost is not None:
        budget["costUSD"] = cost
    return {"spec": {"agentRef": "coder", "budget": budget}}


def test_the_resumed_custodian_starts_from_the_usage_and_the_childrens_carve() -> None:
    status = {
        "phase": "Running", "restarts": 1, "delivery": {"revision": "a" * 40, "state": "Delivered"},
        "usage": {"inputTokens": 300, "outputTokens": 20, "cost": 0.1},
    }  # fmt: skip
    children = [_child(400, 0.25), _child(None, 0.5), {"spec": {"agentRef": "coder"}}]
    assert carved_for(children) == (400, 0.75)
    point = resume_point(session_body(status=status), children)
    assert point is not None and point.revision == "a" * 40
    env = _custodian_env(build_pod(agent(), session(), OperatorSettings(), resume=point))
    assert json.loads(env["CORRAL_USAGE_SEED"])["input"] == 300
    assert json.loads(env["CORRAL_CARVED_SEED"]) == {"cost": 0.75, "tokens": 400}
    # No children: no carve to seed; never resumed: no seed at all.
    lone = resume_point(session_body(status=status), [])
    assert lone is not None
    assert "CORRAL_CARVED_SEED" not in _custodian_env(
        build_pod(agent(), session(), OperatorSettings(), resume=lone)
    )
    assert resume_point(session_body(status={**status, "restarts": 0}), children) is None
