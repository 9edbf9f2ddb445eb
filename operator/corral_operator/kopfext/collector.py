"""CPython's cyclic garbage collector, tuned for a process that keeps thousands of bodies.

With the interpreter's default thresholds, bodies still in flight were promoted and the full
collections that followed stopped the event loop for every Session in flight; larger young
generations let those bodies die first, and what was imported before serving is frozen out of
the collector's sight (ADR 0090; the pauses measured are in docs/performance.md, item 11).

kopf's `Body`, `Meta` and `Patch` kept views that point back to them, so every watch event's
decoded body waited for a collection; `acyclic_kopf_bodies` makes those views on access, so
reference counting frees it (ADR 0091; docs/performance.md, item 17).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kopf._cogs.structs import bodies, dicts, patches

# Allocations (net of frees) before a young collection; young collections before a middle
# one; middle ones before a full one is considered (the interpreter also waits until the
# heap has grown by a quarter since the last one).
THRESHOLDS = (50_000, 20, 100)


@dataclass
class Pauses:
    """How long collections stopped the process, per generation, since `tune`; read by the
    metrics at scrape time. Only plain fields change here: a collection may run in any
    thread at any allocation, even one holding a metrics lock."""

    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    collections: list[int] = field(default_factory=lambda: [0, 0, 0])
    longest: float = 0.0
    _started: float = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        generation = int(info.get("generation", 0))
        self.seconds[generation] += took
        self.collections[generation] += 1
        self.longest = max(self.longest, took)


PAUSES = Pauses()


def tune() -> None:
    """Collect once, freeze what survives (modules, schemas, handlers), set the thresholds,
    and time every collection from now on (`PAUSES`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    if PAUSES not in gc.callbacks:
        gc.callbacks.append(PAUSES)


# kopf's classes that keep views of themselves, and which view each property returns.
_WHOLE_VIEWS = {"meta": "_meta", "metadata": "_meta", "spec": "_spec", "status": "_status"}
_META_VIEWS = {"labels": "_labels", "annotations": "_annotations"}
_VIEWING: tuple[tuple[type, dict[str, str]], ...] = (
    (bodies.Body, _WHOLE_VIEWS),
    (bodies.Meta, _META_VIEWS),
    (patches.Patch, _WHOLE_VIEWS),
    (patches.MetaPatch, _META_VIEWS),
)
_made_acyclic: set[type] = set()


def acyclic_kopf_bodies() -> bool:
    """Make kopf's bodies and patches build their views when asked, not keep them; False (and
    nothing changed) when kopf's classes are not of the shape this knows.

    A kept view points back to what it views, so each `Body` (and each `Patch`, which keeps
    the event's body as its original) was a reference cycle, and with it the event's whole
    decoded JSON waited for the collector. A view is a path over its source, so a new one per
    access reads and writes the same values (a daemon's live body included, whose source kopf
    replaces); building one costs a few hundred nanoseconds. kopf's own `__init__` still runs;
    the kept views are dropped after it."""
    if len(_made_acyclic) == len(_VIEWING):
        return True
    body = bodies.Body({"metadata": {}})
    patch = patches.Patch(body=body)
    probes: dict[type, Any] = {
        bodies.Body: body,
        bodies.Meta: body.meta,
        patches.Patch: patch,
        patches.MetaPatch: patch.meta,
    }
    for cls, views in _VIEWING:
        for prop, attr in views.items():
            kept = vars(probes[cls]).get(attr)
            if not isinstance(cls.__dict__.get(prop), property) or not hasattr(kept, "_path"):
                return False
    for cls, views in _VIEWING:
        for prop, attr in views.items():
            setattr(cls, prop, property(_view_maker(vars(probes[cls])[attr])))
        cls.__init__ = _dropping(cls.__init__, frozenset(views.values()))  # type: ignore[misc]
        _made_acyclic.add(cls)
    return True


def _dropping(init: Callable[..., None], attrs: frozenset[str]) -> Callable[..., None]:
    """kopf's `__init__`, then the kept views dropped."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        for attr in attrs:
            self.__dict__.pop(attr, None)

    return __init__


def _view_maker(kept: Any) -> Callable[[Any], Any]:
    """What makes, for an instance, a view like `kept` (one kopf's `__init__` kept): the same
    class, over the same path when it is a plain view."""
    view_cls, path = type(kept), kept._path
    if view_cls in (dicts.MappingView, dicts.MutableMappingView):
        return lambda self: view_cls(self, path)
    return lambda self: view_cls(self)
