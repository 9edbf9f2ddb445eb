"""The operator's garbage-collector tuning (ADR 0090): thresholds, the frozen start-up heap,
and the pauses its metrics report."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator

import pytest
from kopf._cogs.structs import bodies, patches

from corral_operator.kopfext import collector
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


def _freed_without_the_collector(make: Callable[[], object]) -> bool:
    """Whether what `make` builds is freed by reference counting alone."""
    gc.disable()
    try:
        made = make()
        ref = weakref.ref(made)
        del made
        return ref() is None
    finally:
        gc.enable()


def _read_body() -> bodies.Body:
    body = bodies.Body({"metadata": {"name": "s", "labels": {"a": "1"}}, "spec": {"n": 2}})
    assert (body.meta.name, body.meta.labels["a"], body.spec["n"]) == ("s", "1", 2)
    assert dict(body.status) == {} and dict(body.meta.annotations) == {}
    return body


def _patch_of_a_body() -> patches.Patch:
    """A handler's patch keeps the event's body; writes through its views land in it."""
    patch = patches.Patch(body=_read_body())
    patch.meta.labels["b"] = "2"
    patch.status["phase"] = "Running"
    assert patch == {"metadata": {"labels": {"b": "2"}}, "status": {"phase": "Running"}}
    return patch


def test_a_kopf_body_is_freed_by_reference_counting_once_its_views_are_made_on_access() -> None:
    saved = {
        (cls, name): cls.__dict__[name]
        for cls, names in (
            (bodies.Body, ("__init__", "meta", "metadata", "spec", "status")),
            (bodies.Meta, ("__init__", "labels", "annotations")),
            (patches.Patch, ("__init__", "meta", "metadata", "spec", "status")),
            (patches.MetaPatch, ("__init__", "labels", "annotations")),
        )
        for name in names
    }
    try:
        assert not _freed_without_the_collector(_read_body)  # kopf's own: a cycle
        assert collector.acyclic_kopf_bodies()
        assert collector.acyclic_kopf_bodies()  # a second call changes nothing
        assert _freed_without_the_collector(_read_body)
        assert _freed_without_the_collector(_patch_of_a_body)
        # A daemon's live body: kopf replaces its source, and views made later read the new one.
        live = bodies.Body({"metadata": {"name": "old"}})
        live._replace_with({"metadata": {"name": "new", "labels": {"b": "2"}}})
        assert (live.meta.name, dict(live.metadata.labels)) == ("new", {"b": "2"})
    finally:
        for (cls, name), value in saved.items():
            setattr(cls, name, value)
        collector._made_acyclic.clear()
