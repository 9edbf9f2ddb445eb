"""The model catalog: context windows, output maxima, thinking budgets and prices.

A pure module (no SDK import) so that the custodian can price usage with the same table. Prices
are US dollars per million tokens. `corral-scripted` is the project's scripted demo model; it
costs nothing and accepts every thinking level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral_api.kinds import MAX_OUTPUT_TOKENS_CAP, ThinkingLevel

THINKING_LEVELS: tuple[ThinkingLevel, ...] = ("low", "medium", "high")

# Thinking budget (tokens) sent with every generation, per level.
THINKING_BUDGETS: dict[str, int] = {"low": 1024, "medium": 4096, "high": 16000}

# Window used for a model the catalog does not know (assembly stays conservative).
DEFAULT_CONTEXT_WINDOW = 100_000


@dataclass(frozen=True)
class ModelInfo:
    name: str
    context_window: int
    max_output_tokens: int
    input_per_mtok: float
    output_per_mtok: float
    cache_read_per_mtok: float
    cache_write_per_mtok: float
    thinking: bool = True


def _claude(name: str, window: int, max_out: int, inp: float, out: float) -> ModelInfo:
    # Anthropic prices cache reads at 0.1x input and 5-minute cache writes at 1.25x input.
    return ModelInfo(name, window, max_out, inp, out, round(inp * 0.1, 4), round(inp * 1.25, 4))


MODELS: dict[str, ModelInfo] = {
    m.name: m
    for m in (
        _claude("claude-opus-4-1", 200_000, 32_000, 15.0, 75.0),
        _claude("claude-opus-4-0", 200_000, 32_000, 15.0, 75.0),
        _claude("claude-sonnet-4-5", 200_000, 64_000, 3.0, 15.0),
        _claude("claude-sonnet-4-0", 200_000, 64_000, 3.0, 15.0),
        _claude("claude-3-7-sonnet-latest", 200_000, 64_000, 3.0, 15.0),
        _claude("claude-haiku-4-5", 200_000, 64_000, 1.0, 5.0),
        ModelInfo("claude-3-5-haiku-latest", 200_000, 8_192, 0.8, 4.0, 0.08, 1.0, thinking=False),
        ModelInfo("corral-scripted", 200_000, 64_000, 0.0, 0.0, 0.0, 0.0),
    )
}


class UnknownModel(ValueError):
    pass


def resolve_model(name: str) -> ModelInfo:
    """The catalog entry for `name`, or `UnknownModel` with the names that exist."""
    info = MODELS.get(name)
    if info is None:
        raise UnknownModel(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}")
    return info


def window_of(name: str) -> int | None:
    """The registered context window, or None for a model the catalog does not know."""
    info = MODELS.get(name)
    return info.context_window if info is not None else None


def resolve_thinking_level(level: str) -> ThinkingLevel:
    for known in THINKING_LEVELS:
        if level == known:
            return known
    raise ValueError(f"unknown thinking level {level!r}; expected one of low, medium, high")


def clamp_output_tokens(info: ModelInfo, requested: int | None) -> int:
    """min(the call's request, the model's maximum, the soft cap); a call cannot raise the cap."""
    limit = min(info.max_output_tokens, MAX_OUTPUT_TOKENS_CAP)
    return limit if requested is None else max(1, min(requested, limit))


def thinking_param(info: ModelInfo, level: ThinkingLevel, max_tokens: int) -> dict[str, Any]:
    """The `thinking` request field for a level. The budget stays below max_tokens."""
    if not info.thinking or max_tokens <= 1024:
        return {"type": "disabled"}
    return {"type": "enabled", "budget_tokens": min(THINKING_BUDGETS[level], max_tokens - 1)}


def cost_usd(
    info: ModelInfo, *, input: int, output: int, cache_read: int = 0, cache_write: int = 0
) -> float:
    total = (
        input * info.input_per_mtok
        + output * info.output_per_mtok
        + cache_read * info.cache_read_per_mtok
        + cache_write * info.cache_write_per_mtok
    ) / 1_000_000
    return round(total, 10)
