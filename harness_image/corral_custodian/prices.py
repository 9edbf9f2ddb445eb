"""Prices for the usage the custodian records, from the harness's model catalog.

One table for both containers (the catalog is a pure module). A dated model id such as
`claude-haiku-4-5-20251001` takes the price of the longest catalog name it starts with; a model
the catalog does not know costs 0 and is named in the usage totals as unpriced.
"""

from __future__ import annotations

from corral_common.catalog import MODELS, ModelInfo, cost_usd


def price_for(model: str) -> ModelInfo | None:
    if model in MODELS:
        return MODELS[model]
    matches = [name for name in MODELS if model.startswith(name)]
    return MODELS[max(matches, key=len)] if matches else None


def call_cost(model: str, *, input: int, output: int, cache_read: int, cache_write: int) -> float:
    info = price_for(model)
    if info is None:
        return 0.0
    return cost_usd(
        info, input=input, output=output, cache_read=cache_read, cache_write=cache_write
    )
