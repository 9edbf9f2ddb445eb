"""Assembly: order, strategies per layer, budgets from defaults, Agent and call."""

from __future__ import annotations

import pytest

from corral_api.kinds import LayerBudgets
from corral_harness.context import (
    DEFAULT_BUDGETS,
    LayerName,
    Strategy,
    Unit,
    UnknownLayer,
    assemble,
    resolve_budgets,
)


def _contents() -> dict[LayerName, list[Unit]]:
    return {
        LayerName.IDENTITY: [Unit("", "You are a careful engineer.")],
        LayerName.INSTRUCTION_FILES: [
            Unit("AGENTS.md", "root rules"),
            Unit("pkg/AGENTS.md", "pkg"),
        ],
        LayerName.PROJECT_CONTEXT: [Unit("", "p" * 400)],
        LayerName.BUSINESS_RULES: [Unit("rule-1", "old rule"), Unit("rule-2", "new rule")],
        LayerName.TASK_STATE: [Unit("task", "fix the bug")],
    }


def test_layers_are_joined_in_the_fixed_order() -> None:
    result = assemble(_contents(), DEFAULT_BUDGETS)
    order = [result.prompt.index(f"<{n.value}>") for n in LayerName]
    assert order == sorted(order)
    assert result.prompt.startswith("<identity>\nYou are a careful engineer.")


def test_identity_over_budget_is_dropped_whole() -> None:
    budgets = {**DEFAULT_BUDGETS, LayerName.IDENTITY: 3}
    result = assemble(_contents(), budgets)
    report = result.layer("identity")
    assert report.strategy == "keep_or_drop"
    assert report.tokens == 0 and report.kept == [] and report.dropped == [""]
    assert "<identity>" not in result.prompt


def test_project_context_is_truncated_with_a_marker() -> None:
    budgets = {**DEFAULT_BUDGETS, LayerName.PROJECT_CONTEXT: 20}
    result = assemble(_contents(), budgets)
    report = result.layer(LayerName.PROJECT_CONTEXT)
    assert report.truncated and report.tokens <= 20
    assert "[… truncated …]" in result.prompt


def test_business_rules_drop_the_oldest_first() -> None:
    budgets = {**DEFAULT_BUDGETS, LayerName.BUSINESS_RULES: 5}
    report = assemble(_contents(), budgets).layer("business_rules")
    assert report.kept == ["rule-2"] and report.dropped == ["rule-1"]


def test_empty_layers_cost_nothing() -> None:
    result = assemble({}, DEFAULT_BUDGETS)
    assert result.prompt == "" and all(r.tokens == 0 for r in result.layers)


def test_a_strategy_can_be_chosen_per_call() -> None:
    budgets = {**DEFAULT_BUDGETS, LayerName.PROJECT_CONTEXT: 20}
    result = assemble(
        _contents(), budgets, strategies={LayerName.PROJECT_CONTEXT: Strategy.KEEP_OR_DROP}
    )
    assert result.layer("project_context").tokens == 0


def test_budgets_resolve_defaults_then_agent_then_call() -> None:
    agent = LayerBudgets(identity=10, task_state=20)
    budgets = resolve_budgets(agent, {"task_state": 5})
    assert budgets[LayerName.IDENTITY] == 10
    assert budgets[LayerName.TASK_STATE] == 5
    assert budgets[LayerName.PROJECT_CONTEXT] == DEFAULT_BUDGETS[LayerName.PROJECT_CONTEXT]


def test_unknown_layer_or_negative_budget_is_a_clear_error() -> None:
    with pytest.raises(UnknownLayer, match="unknown context layer 'tools'"):
        resolve_budgets(None, {"tools": 3})
    with pytest.raises(ValueError, match=">= 0"):
        resolve_budgets(None, {"identity": -1})


def test_a_real_tokenizer_can_be_plugged_in() -> None:
    class WordTokenizer:
        estimated = False

        def count(self, text: str) -> int:
            return len(text.split())

    result = assemble(_contents(), DEFAULT_BUDGETS, tokenizer=WordTokenizer())
    assert result.estimated is False
    assert result.layer("task_state").tokens == len(["[task]", "fix", "the", "bug"])
