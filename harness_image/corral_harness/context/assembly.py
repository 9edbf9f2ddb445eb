"""Context assembly: a pure function from layer contents and budgets to a prompt and a report.

It opens nothing (no session, no files, no memory store); the caller collects the contents.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from .layers import DEFAULT_STRATEGIES, LAYER_ORDER, LayerName, Strategy
from .tokenizer import DEFAULT_TOKENIZER, Tokenizer
from .trimming import drop_whole_units, keep_or_drop, truncate_tail


@dataclass(frozen=True)
class Unit:
    """One piece of a layer: an AGENTS.md file, a rule, a blob. `source` names it in reports.

    With `header`, the rendered text starts with `[source]` so the model can tell pieces apart.
    """

    source: str
    text: str
    header: bool = True

    def render(self) -> str:
        return f"[{self.source}]\n{self.text}" if self.source and self.header else self.text


def render_units(units: Sequence[Unit]) -> str:
    return "\n\n".join(u.render() for u in units)


@dataclass(frozen=True)
class LayerReport:
    name: str
    strategy: str
    budget: int
    tokens: int
    estimated: bool
    kept: list[str]
    dropped: list[str]
    truncated: bool
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tokens": self.tokens,
            "estimated": self.estimated,
            "strategy": self.strategy,
            "budget": self.budget,
            "kept": self.kept,
            "dropped": self.dropped,
            "truncated": self.truncated,
        }


@dataclass(frozen=True)
class AssembledContext:
    layers: list[LayerReport]
    prompt: str
    tokens: int
    estimated: bool
    kept_units: dict[str, list[Unit]] = field(default_factory=dict)
    # Each non-empty layer's section of the prompt, in the prompt's order (by layer name).
    sections: dict[str, str] = field(default_factory=dict)

    def layer(self, name: LayerName | str) -> LayerReport:
        key = name.value if isinstance(name, LayerName) else name
        return next(r for r in self.layers if r.name == key)

    def layer_tokens(self) -> dict[str, int]:
        return {r.name: r.tokens for r in self.layers}

    def leading_sections(self, layers: Collection[str]) -> tuple[str, ...]:
        """The prompt's first sections while their layers are among `layers`: joined by blank
        lines they start the prompt (the parts a request marks for the prompt cache)."""
        leading: list[str] = []
        for name, section in self.sections.items():
            if name not in layers:
                break
            leading.append(section)
        return tuple(leading)


def _section(name: str, body: str) -> str:
    return f"<{name}>\n{body}\n</{name}>"


def trim_layer(
    name: LayerName,
    units: Sequence[Unit],
    budget: int,
    strategy: Strategy,
    tokenizer: Tokenizer,
) -> tuple[LayerReport, list[Unit]]:
    if strategy is Strategy.DROP_WHOLE_UNITS:
        # These layers (the instruction files, the rules) come back unchanged step after step,
        # and trimming 200 AGENTS.md costs more than finding them unchanged: the same inputs
        # give the same answer, so it is kept (units compare by value; their texts' hashes are
        # cached by the strings themselves).
        # A caller that hands back the very same units tuple (the turn policy does while the
        # tree is unchanged) is answered by identity: hashing and comparing 200 units by value
        # is most of what the cache below costs.
        same = _last_trim.get(name)
        if same is not None and same[0] is units and same[1] == budget and same[2] is tokenizer:
            return same[3], list(same[4])
        try:
            report, kept = _trim_whole_units(name, tuple(units), budget, cast(Hashable, tokenizer))
        except TypeError:  # a tokenizer that cannot be a key
            return _trim(name, units, budget, strategy, tokenizer)
        if isinstance(units, tuple):
            _last_trim[name] = (units, budget, tokenizer, report, kept)
        return report, list(kept)
    return _trim(name, units, budget, strategy, tokenizer)


# The last whole-unit trim of each layer, by the identity of its (immutable) units tuple.
_last_trim: dict[
    LayerName, tuple[tuple[Unit, ...], int, Tokenizer, LayerReport, tuple[Unit, ...]]
] = {}


@functools.lru_cache(maxsize=32)
def _trim_whole_units(
    name: LayerName, units: tuple[Unit, ...], budget: int, tokenizer: Hashable
) -> tuple[LayerReport, tuple[Unit, ...]]:
    counter = cast(Tokenizer, tokenizer)
    report, kept = _trim(name, units, budget, Strategy.DROP_WHOLE_UNITS, counter)
    return report, tuple(kept)


def _trim(
    name: LayerName,
    units: Sequence[Unit],
    budget: int,
    strategy: Strategy,
    tokenizer: Tokenizer,
) -> tuple[LayerReport, list[Unit]]:
    units = [u for u in units if u.text]
    truncated = False
    if strategy is Strategy.DROP_WHOLE_UNITS:
        kept, dropped = drop_whole_units(units, budget, tokenizer, render_units)
        body = render_units(kept)
    else:
        # Blob layers: the units form one text, trimmed as a whole.
        blob = render_units(units)
        if strategy is Strategy.TRUNCATE_TAIL:
            body, truncated = truncate_tail(blob, budget, tokenizer)
        else:
            body = keep_or_drop(blob, budget, tokenizer)
        kept, dropped = (units, []) if body else ([], units)
    report = LayerReport(
        name=name.value,
        strategy=strategy.value,
        budget=budget,
        tokens=tokenizer.count(body) if body else 0,
        estimated=tokenizer.estimated,
        kept=[u.source for u in kept],
        dropped=[u.source for u in dropped],
        truncated=truncated,
        text=body,
    )
    return report, list(kept)


def assemble(
    contents: Mapping[LayerName, Sequence[Unit]],
    budgets: Mapping[LayerName, int],
    *,
    strategies: Mapping[LayerName, Strategy] | None = None,
    tokenizer: Tokenizer = DEFAULT_TOKENIZER,
) -> AssembledContext:
    """Trim each layer to its budget and join them in the fixed layer order."""
    chosen = {**DEFAULT_STRATEGIES, **(strategies or {})}
    reports: list[LayerReport] = []
    kept_units: dict[str, list[Unit]] = {}
    sections: dict[str, str] = {}
    for name in LAYER_ORDER:
        report, kept = trim_layer(
            name, contents.get(name, ()), budgets[name], chosen[name], tokenizer
        )
        reports.append(report)
        kept_units[name.value] = kept
        if report.text:
            sections[name.value] = _section(name.value, report.text)
    prompt = "\n\n".join(sections.values())
    return AssembledContext(
        layers=reports,
        prompt=prompt,
        tokens=tokenizer.count(prompt),
        estimated=tokenizer.estimated,
        kept_units=kept_units,
        sections=sections,
    )
