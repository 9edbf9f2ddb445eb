"""CPython's cyclic garbage collector, tuned for a process that keeps thousands of bodies.

The operator keeps every watched Session, pod and Agent it plans from, and kopf keeps its own
copies: a large heap of long-lived objects, most of them JSON that reference counting frees on
its own. With the interpreter's default thresholds (700, 10, 10) the young generations were
collected so often that short-lived bodies still in flight were promoted, and the full
collections that promotion triggers (each one walks the whole heap with the event loop
stopped) came every two seconds in a 1,000-Session burst, 250 to 900 ms each: 18 of the
operator's 49 CPU seconds, and a pause every Session in flight waited through (ADR 0090).

Larger young generations let in-flight bodies die before a collection sees them, so little
is promoted and full collections become rare; what the process imported before it serves is
moved out of the collector's sight altogether (`gc.freeze`), since it lives as long as the
process. Cycles are still collected, and there are many: kopf's `Body` keeps views of its
metadata, spec and status that point back to it, so every watch event's decoded body is a
cycle; the young collections free them.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any

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
