"""Prices for the usage the custodian records, from the harness's model catalog.

One table for both containers: the shipped catalog with the platform's overlay
(`CORRAL_MODEL_CATALOG`, docs/model-catalog.md). An id the catalog does not list, such as a newer
dated one, takes the price of the longest catalog name it starts with; a model the catalog does
not know costs 0 and is named in the usage totals as unpriced.
"""

from __future__ import annotations

from corral_common.catalog import ModelInfo, cost_usd, models


def price_for(model: str) -> ModelInfo | None:
    known = models()
    if model in known:
        return known[model]
    matches = [name for name in known if model.startswith(name)]
    return known[max(matches, key=len)] if matches else None


def call_cost(model: str, *, input: int, output: int, cache_read: int, cache_write: int) -> float:
    info = price_for(model)
    if info is None:
        return 0.0
    return cost_usd(
        info, input=input, output=output, cache_read=cache_read, cache_write=cache_write
    )
