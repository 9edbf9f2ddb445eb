"""The operator's garbage-collector tuning (ADR 0090): thresholds, the frozen start-up heap,
and the pauses its metrics report."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from corral_operator import collector
from corral_operator.metrics import OperatorMetrics


@pytest.fixture
def tuned() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        collector.tune()
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
        if collector.PAUSES in gc.callbacks:
            gc.callbacks.remove(collector.PAUSES)


def test_tuning_freezes_the_start_up_heap_and_sets_larger_generations(tuned: None) -> None:
    assert gc.get_threshold() == collector.THRESHOLDS
    assert gc.get_freeze_count() > 1000  # modules and their objects leave the collector's sight
    assert collector.THRESHOLDS[0] > 700  # the interpreter's default promoted bodies in flight


def test_every_collection_is_timed_and_exported(tuned: None) -> None:
    full_before = collector.PAUSES.collections[2]
    gc.collect()
    assert collector.PAUSES.collections[2] == full_before + 1
    assert collector.PAUSES.seconds[2] > 0.0
    assert collector.PAUSES.longest > 0.0
    registry = OperatorMetrics().registry
    samples = {
        (sample.name, sample.labels.get("generation", "")): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name.startswith("corral_gc_")
    }
    assert samples[("corral_gc_collections_total", "2")] == collector.PAUSES.collections[2]
    assert samples[("corral_gc_pause_seconds_total", "2")] == collector.PAUSES.seconds[2]
    assert samples[("corral_gc_longest_pause_seconds", "")] == collector.PAUSES.longest
