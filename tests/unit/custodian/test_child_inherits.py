"""A child Session inherits its parent's thinking level and loop choice, never its forced
plan (seed 003's turn rules; docs/ledger.md)."""

from __future__ import annotations

from dataclasses import replace

from corral_api.kinds import Session
from corral_custodian import rules

from .test_custodian_rules import agent, facts


def _child(parent_facts: rules.SessionFacts, parent_spec: dict[str, object]) -> dict[str, object]:
    plan = rules.decide_spawn(parent_facts, {"task": "fix it"}, children_this_turn=0)
    assert isinstance(plan, rules.ChildPlan)
    manifest = rules.child_session_manifest(parent_facts, plan, parent_spec, "turn-1")
    Session.model_validate(manifest)  # a valid Session for the API server
    spec = manifest["spec"]
    assert isinstance(spec, dict)
    return spec


def test_the_child_gets_the_parents_agent_level_and_loop() -> None:
    parent = replace(
        facts(),
        agent=agent(max_turns=10).model_copy(
            update={"thinking_level": "high", "loop": "investigate"}
        ),
    )
    spec = _child(parent, {"workspace": {"repo": "https://git/x", "ref": "main"}})
    assert spec["overrides"] == {"thinkingLevel": "high", "loop": "investigate"}


def test_the_parents_own_overrides_win_and_its_forced_plan_stays_home() -> None:
    parent_spec = {
        "workspace": {"repo": "https://git/x", "ref": "main"},
        "overrides": {"thinkingLevel": "low", "loop": "checklist"},
        "plan": {"steps": [{"title": "one"}]},
        "decideThenAct": True,
    }
    spec = _child(facts(), parent_spec)
    assert spec["overrides"] == {"thinkingLevel": "low", "loop": "checklist"}
    assert "plan" not in spec and "decideThenAct" not in spec
