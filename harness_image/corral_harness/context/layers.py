"""The five context layers, their default budgets and trimming strategies."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from corral_api.kinds import LayerBudgets


class LayerName(StrEnum):
    IDENTITY = "identity"
    INSTRUCTION_FILES = "instruction_files"
    PROJECT_CONTEXT = "project_context"
    BUSINESS_RULES = "business_rules"
    TASK_STATE = "task_state"


class Strategy(StrEnum):
    DROP_WHOLE_UNITS = "drop_whole_units"
    TRUNCATE_TAIL = "truncate_tail"
    KEEP_OR_DROP = "keep_or_drop"


# Assembly order is this tuple's order.
LAYER_ORDER: Final = tuple(LayerName)

# The leading layers that stay the same step after step (the Agent's identity, its instruction
# files): a request marks where each ends for the provider's prompt cache (engine/caching.py).
STABLE_LAYERS: Final = frozenset({LayerName.IDENTITY, LayerName.INSTRUCTION_FILES})

DEFAULT_STRATEGIES: Final[dict[LayerName, Strategy]] = {
    # Half an identity is useless.
    LayerName.IDENTITY: Strategy.KEEP_OR_DROP,
    # Units arrive least authoritative first, so dropping from the head keeps the strongest.
    LayerName.INSTRUCTION_FILES: Strategy.DROP_WHOLE_UNITS,
    LayerName.PROJECT_CONTEXT: Strategy.TRUNCATE_TAIL,
    # Rules arrive oldest first; a rule is never split.
    LayerName.BUSINESS_RULES: Strategy.DROP_WHOLE_UNITS,
    # The task's opening words say what it is; keep them even when the tail goes.
    LayerName.TASK_STATE: Strategy.TRUNCATE_TAIL,
}

DEFAULT_BUDGETS: Final[dict[LayerName, int]] = {
    LayerName.IDENTITY: 4_000,
    LayerName.INSTRUCTION_FILES: 12_000,
    LayerName.PROJECT_CONTEXT: 4_000,
    LayerName.BUSINESS_RULES: 2_000,
    LayerName.TASK_STATE: 8_000,
}


class UnknownLayer(ValueError):
    def __init__(self, name: str) -> None:
        known = ", ".join(n.value for n in LAYER_ORDER)
        super().__init__(f"unknown context layer {name!r}; known layers: {known}")


def parse_layer(name: str) -> LayerName:
    try:
        return LayerName(name)
    except ValueError:
        raise UnknownLayer(name) from None


def resolve_budgets(
    agent: LayerBudgets | None = None, call: dict[str, int] | None = None
) -> dict[LayerName, int]:
    """Defaults, then the Agent's budgets, then the call's: the later one wins."""
    budgets = dict(DEFAULT_BUDGETS)
    if agent is not None:
        for layer in LAYER_ORDER:
            value = getattr(agent, layer.value)
            if value is not None:
                budgets[layer] = value
    for name, value in (call or {}).items():
        if value < 0:
            raise ValueError(f"budget for layer {name!r} must be >= 0, got {value}")
        budgets[parse_layer(name)] = value
    return budgets
