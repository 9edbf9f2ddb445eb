"""Default deny, wildcards against the live catalog, deny over allow, the fixed rule, the cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral_harness.policy import FORBIDDEN, MAX_VISIBLE_TOOLS, TOOL_SEARCH_NAME, answer_tool_search
from corral_harness.policy.fixed_rule import forbidden_reason
from corral_harness.policy.turn_policy import CorralTurnPolicy
from corral_harness.ports import ToolCall, ToolSpec

from ._helpers import OBJ, WORKING, agent, ctx, menu


def _names(tools: list[ToolSpec]) -> list[str]:
    return [t.name for t in tools]


def test_default_deny_shows_only_tool_search(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    c = ctx(tmp_path, agent(allow=[]))
    assert _names(policy.visible_tools(c, WORKING)) == [TOOL_SEARCH_NAME]


async def test_default_deny_refuses_an_unlisted_call(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    c = ctx(tmp_path, agent(allow=["read"]))
    policy.visible_tools(c, WORKING)
    decision = await policy.decide_tool(c, ToolCall("t1", "bash", {"command": "ls"}))
    assert decision.outcome == "deny" and "not in the Agent's tools.allow" in decision.reason


def test_wildcards_match_the_live_catalog_each_step(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    c = ctx(tmp_path, agent(allow=["read", "mcp__corral__*"]))
    first = policy.visible_tools(c, [*WORKING, menu("walk_tree")])
    assert _names(first) == [TOOL_SEARCH_NAME, "read", "mcp__corral__walk_tree"]
    # Next step the Menu changed: the same pattern now matches what is there.
    second = policy.visible_tools(c, [*WORKING, menu("spawn_child"), menu("push")])
    assert _names(second) == [
        TOOL_SEARCH_NAME,
        "read",
        "mcp__corral__spawn_child",
        "mcp__corral__push",
    ]


async def test_a_tool_not_on_this_steps_list_is_refused(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    c = ctx(tmp_path, agent(allow=["mcp__corral__*"]))
    policy.visible_tools(c, [menu("walk_tree")])
    decision = await policy.decide_tool(c, ToolCall("t1", "mcp__corral__spawn_child", {}))
    assert decision.outcome == "deny" and "not on this step's tool list" in decision.reason


async def test_deny_beats_allow_even_under_a_wildcard(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    c = ctx(tmp_path, agent(allow=["*"], deny=["bash", "push"]))
    shown = _names(policy.visible_tools(c, [*WORKING, menu("push")]))
    assert "bash" not in shown and "mcp__corral__push" not in shown and "read" in shown
    decision = await policy.decide_tool(c, ToolCall("t1", "bash", {"command": "true"}))
    assert decision.outcome == "deny" and "tools.deny" in decision.reason


@pytest.mark.parametrize(
    "name",
    [
        "read_secret",
        "mcp__corral__get_credentials",
        "mcp__corral__approve",
        "mcp__corral__decide_approval",
        "raw_model_call",
        "mcp__corral__kill_switch",
        "freeze_scope",
        "rewrite_state",
        "mcp__corral__ledger_write",
    ],
)
async def test_the_fixed_rule_hides_control_even_under_star(tmp_path: Path, name: str) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    c = ctx(tmp_path, agent(allow=["*", name]))
    tool = ToolSpec(name, "tempting", OBJ, kind="menu" if name.startswith("mcp") else "working")
    assert name not in _names(policy.visible_tools(c, [tool, *WORKING]))
    decision = await policy.decide_tool(c, ToolCall("t1", name, {}))
    assert decision.outcome == "deny" and "fixed rule" in decision.reason


def test_the_fixed_rule_is_data_and_spares_ordinary_tools() -> None:
    assert set(FORBIDDEN) == {
        "secrets",
        "approval gate",
        "raw model call",
        "kill switch",
        "state rewriting",
    }
    for ok in ("read", "bash", "mcp__corral__request_approval", "mcp__corral__push"):
        assert forbidden_reason(ok) is None, ok


def test_at_most_128_tools_each_with_one_line(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    catalog = [
        ToolSpec(f"tool{i:03d}", f"Tool {i}.\nLong second line.", OBJ, instructions="x" * 500)
        for i in range(300)
    ]
    shown = policy.visible_tools(ctx(tmp_path), catalog)
    assert len(shown) == MAX_VISIBLE_TOOLS
    assert shown[0].name == TOOL_SEARCH_NAME
    assert all("\n" not in t.description for t in shown)
    assert shown[1].description == "Tool 0."


def test_tool_search_fetches_longer_instructions_on_demand(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    tool = menu("spawn_child", "Start a child.", instructions="Children inherit the loop.")
    shown = policy.visible_tools(ctx(tmp_path), [tool])
    assert all("inherit" not in t.description for t in shown)
    doc = answer_tool_search({"name": "mcp__corral__spawn_child"}, shown)
    assert "Children inherit the loop." in doc
    assert "mcp__corral__spawn_child" in answer_tool_search({"query": "child"}, shown)
    assert answer_tool_search({"name": "mcp__corral__approve"}, shown).startswith("error:")
    assert answer_tool_search({}, shown).startswith("error:")


async def test_tool_search_is_always_allowed(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    c = ctx(tmp_path, agent(allow=[]))
    policy.visible_tools(c, WORKING)
    decision = await policy.decide_tool(c, ToolCall("t1", TOOL_SEARCH_NAME, {"query": "x"}))
    assert decision.outcome == "allow"


def test_the_policy_answers_tool_search_from_this_steps_list(tmp_path: Path) -> None:
    policy = CorralTurnPolicy(granted_root=tmp_path)
    c = ctx(tmp_path, agent(allow=["mcp__corral__*"], deny=["mcp__corral__land"]))
    policy.visible_tools(
        c, [menu("push", "Push.", "Fast-forward only."), menu("land", "Land.", "Needs evidence.")]
    )
    assert "Fast-forward only." in policy.answer_tool_search(c, {"name": "mcp__corral__push"})
    # A hidden tool's instructions are not reachable through search either.
    assert policy.answer_tool_search(c, {"name": "mcp__corral__land"}).startswith("error:")
    assert "land" not in policy.answer_tool_search(c, {"query": "evidence"})
