"""Budget arithmetic: the lowest of several caps, and what is left of one after some usage.

Pure; the Session planner derives a Session's budget from its parent chain with it and the pod
builder falls back on it, so it sits below both.
"""

from __future__ import annotations

from corral_api.kinds import Budget, Usage


def lowest(*budgets: Budget | None) -> Budget:
    """The lowest cap on each axis of the budgets given; an unset axis caps nothing."""
    tokens = [b.tokens for b in budgets if b is not None and b.tokens is not None]
    costs = [b.cost_usd for b in budgets if b is not None and b.cost_usd is not None]
    return _budget(min(tokens) if tokens else None, min(costs) if costs else None)


def _budget(tokens: int | None, cost: float | None) -> Budget:
    # Not validated: a remainder may be zero, which a Budget in a spec may not be.
    return Budget.model_construct(tokens=tokens, cost_usd=cost)


def tokens_counted(usage: Usage) -> int:
    """Tokens as a budget counts them: input + output + cache writes (cache reads are free)."""
    return usage.input_tokens + usage.output_tokens + usage.cache_write_tokens


def remainder(budget: Budget, usage: Usage) -> Budget:
    """What is left of `budget` after `usage`, never below zero; unset axes stay unset."""
    tokens = None if budget.tokens is None else max(0, budget.tokens - tokens_counted(usage))
    cost = None if budget.cost_usd is None else max(0.0, round(budget.cost_usd - usage.cost, 10))
    return _budget(tokens, cost)
