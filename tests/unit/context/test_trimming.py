"""The trimming strategies, as properties and as examples."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral_harness.context import (
    DEFAULT_TOKENIZER,
    TRUNCATION_MARKER,
    LayerName,
    Unit,
    assemble,
    render_units,
)
from corral_harness.context.trimming import drop_whole_units, keep_or_drop, truncate_tail

tok = DEFAULT_TOKENIZER
unit_lists = st.lists(
    st.builds(Unit, source=st.text(min_size=1, max_size=8), text=st.text(min_size=1, max_size=300)),
    max_size=12,
)
budgets = st.integers(min_value=0, max_value=400)


@settings(max_examples=300, deadline=None)
@given(units=unit_lists, budget=budgets)
def test_drop_whole_units_never_over_budget_never_splits(units: list[Unit], budget: int) -> None:
    kept, dropped = drop_whole_units(units, budget, tok, render_units)
    assert tok.count(render_units(kept)) <= budget
    # Every unit is either kept whole or dropped whole, none lost, none altered.
    assert sorted(map(id, kept + dropped)) == sorted(map(id, units))
    # Kept units keep their order: a subsequence of the input.
    positions = [next(i for i, u in enumerate(units) if u is k) for k in kept]
    assert positions == sorted(positions)


@settings(max_examples=300, deadline=None)
@given(units=unit_lists, budget=budgets)
def test_drop_whole_units_drops_from_the_head(units: list[Unit], budget: int) -> None:
    kept, _ = drop_whole_units(units, budget, tok, render_units)
    fitting = [u for u in units if tok.count(render_units([u])) <= budget]
    # What survives is a suffix of the units that could fit at all.
    assert kept == fitting[len(fitting) - len(kept) :]
    # And it is the longest such suffix: one more from the head would not fit.
    if len(kept) < len(fitting):
        longer = fitting[len(fitting) - len(kept) - 1 :]
        assert tok.count(render_units(longer)) > budget


def test_a_unit_larger_than_the_budget_goes_whole_and_alone() -> None:
    small_a, huge, small_b = Unit("a", "x" * 8), Unit("huge", "y" * 400), Unit("b", "z" * 8)
    kept, dropped = drop_whole_units([small_a, huge, small_b], 20, tok, render_units)
    assert dropped == [huge]
    assert kept == [small_a, small_b]


def test_drop_order_is_head_first() -> None:
    units = [Unit(str(i), "w" * 36) for i in range(5)]  # one renders to 10 tokens, two to 21
    kept, dropped = drop_whole_units(units, 21, tok, render_units)
    assert [u.source for u in dropped] == ["0", "1", "2"]
    assert [u.source for u in kept] == ["3", "4"]


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=2000), budget=budgets)
def test_truncate_tail_is_a_utf8_safe_prefix_within_budget(text: str, budget: int) -> None:
    out, truncated = truncate_tail(text, budget, tok)
    assert tok.count(out) <= budget
    out.encode("utf-8")  # never a broken sequence
    if not truncated:
        assert out == text
    elif out:
        assert out.endswith(TRUNCATION_MARKER)
        assert text.startswith(out[: -len(TRUNCATION_MARKER)])


def test_truncate_tail_does_not_split_multibyte_characters() -> None:
    text = "é" * 100  # 2 bytes each
    out, truncated = truncate_tail(text, 20, tok)
    assert truncated
    prefix = out[: -len(TRUNCATION_MARKER)]
    assert set(prefix) == {"é"}
    assert tok.count(out) <= 20
    # The longest prefix that fits: one more character would not.
    assert tok.count(prefix + "é" + TRUNCATION_MARKER) > 20


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=500), budget=budgets)
def test_keep_or_drop_is_all_or_nothing(text: str, budget: int) -> None:
    out = keep_or_drop(text, budget, tok)
    assert out in (text, "")
    assert (out == text) == (tok.count(text) <= budget)


def test_default_tokenizer_is_ceil_bytes_over_four_and_estimated() -> None:
    assert tok.count("") == 0
    assert tok.count("abcd") == 1
    assert tok.count("abcde") == 2
    assert tok.count("é") == 1  # 2 bytes
    assert tok.estimated is True


@settings(max_examples=150, deadline=None)
@given(
    contents=st.dictionaries(st.sampled_from(list(LayerName)), unit_lists),
    budget_values=st.lists(budgets, min_size=5, max_size=5),
)
def test_every_assembled_layer_fits_its_budget(
    contents: dict[LayerName, list[Unit]], budget_values: list[int]
) -> None:
    layer_budgets = dict(zip(LayerName, budget_values, strict=True))
    result = assemble(contents, layer_budgets)
    for report in result.layers:
        assert report.tokens <= layer_budgets[LayerName(report.name)]
        assert report.estimated is True
    # Layers appear in the fixed order.
    assert [r.name for r in result.layers] == [n.value for n in LayerName]
