"""How the run is scheduled, and what it cost.

`make test` runs the suite on TEST_WORKERS workers at once (three by default and on CI;
pytest-xdist, `--dist loadgroup`; ADR 0097; 0 runs one process): much of the cluster tier's
time is spent waiting for real processes (pods, the operator, the API server), so tests that
wait overlap.
What must stay in one process is a group, run by one worker in collection order:

- `node`: the real node tier (one real node per machine: containerd, kube-proxy, iptables);
- `attack`: the malicious-agent suite (its canaries are per process, and its final sweep
  searches after every other attack test);
- each module with a module-scoped fixture (set up once, not once per worker that runs it).

Every other test is scheduled on its own. The tiers whose tests wait longest are collected
first (xdist hands out the large groups first, then single tests in collection order), so
the cluster tier's waits overlap the CPU-bound unit tests instead of following them.

At the end the run prints, per tier (tests/<tier>/), its tests, the sum of their setup, call
and teardown (the work; session fixtures are charged to the test that first needs them), and
its span on the wall clock, against its budget; any phase a tier ran outside its tests; the
whole run's time since `make test` started (CORRAL_RUN_STARTED); and the 20 slowest tests.
A run longer than CORRAL_RUN_LIMIT_SECONDS (75 minutes: CI stops at 90) fails with the figure,
so a later change cannot drift past CI's limit unseen.

The budgets are spans on CI's 2-core machine with warm caches and three workers, so the
tiers' spans overlap (docs/operations.md has the cold and warm figures). A tier over its
budget is named at the end of the run; with CORRAL_ENFORCE_TIER_BUDGETS=1 it also fails the
run.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from typing import Any

import pytest

# Wall-clock seconds per tier, from its first test's start to its last test's end, warm
# caches, three workers (the spans overlap: the unit tests fill the other tiers' waits, so
# their span is most of the run); about 1.3x what ADR 0097 measured. A cold machine adds the
# builds, shown apart.
TIER_BUDGETS: dict[str, float] = {
    "unit": 900,
    "wire": 840,
    "e2e_local": 720,
    "cluster": 620,
    "attack": 300,
    "node": 300,
}
# Phases run outside any test, per tier, on a warm machine: the node tier's build rebuilds
# Corral's two images when a source file they copy changed (~100-130 s), else ~1 s. A cold
# build is over it and says so.
OUTSIDE_BUDGETS: dict[str, float] = {"node": 300}
# The whole of `make test`, warm (the target), and the limit past which it fails.
RUN_BUDGET = 15 * 60.0
RUN_LIMIT = float(os.environ.get("CORRAL_RUN_LIMIT_SECONDS") or 75 * 60)
SLOWEST = 20

# Collection order of the tiers on workers: longest waits first (see the module docstring).
TIER_ORDER = ("node", "attack", "cluster", "e2e_local", "wire", "unit")
# In one process: the real node last, so its build (tens of minutes cold) runs beside the rest.
SERIAL_TIER_ORDER = ("attack", "cluster", "e2e_local", "unit", "wire", "node")
GROUPED_TIERS = ("node", "attack")

_work: dict[str, float] = defaultdict(float)
_span: dict[str, list[float]] = {}
_tests: dict[str, int] = defaultdict(int)
_per_test: dict[str, float] = defaultdict(float)
_phases: dict[str, list[tuple[str, float, bool]]] = defaultdict(list)
_started = time.time()


def record_tier_time(tier: str, what: str, seconds: float, *, outside_tests: bool = False) -> None:
    """A named phase of `tier` for the summary; `outside_tests` adds it to the tier's total
    (a phase inside a fixture is already in the test durations)."""
    _phases[tier].append((what, seconds, outside_tests))


def tier_of(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    if len(parts) > 2 and parts[0] == "tests":
        return parts[1]
    return "other"


def _has_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


def pytest_itemcollected(item: pytest.Item) -> None:
    """The groups of the module docstring, marked as each test is collected: xdist names each
    test's group from these marks in its own `pytest_collection_modifyitems`."""
    tier = tier_of(item.nodeid)
    if tier in GROUPED_TIERS:
        item.add_marker(pytest.mark.xdist_group(tier))
    elif _has_module_fixture(item):
        module = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(module.replace("/", ".")))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tiers in TIER_ORDER (a stable sort: each tier keeps its own order), before the attack
    tier moves its final sweep last."""
    on_workers = hasattr(config, "workerinput")
    order = TIER_ORDER if on_workers else SERIAL_TIER_ORDER
    rank = {tier: i for i, tier in enumerate(order)}
    items.sort(key=lambda item: rank.get(tier_of(item.nodeid), len(rank)))


class _GroupCheck:
    """Fails the run when xdist did not name a marked test's group in its id: the groups would
    be scattered across workers, and the node tier would start one real node per worker."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if not config.getvalue("loadgroup"):
            return
        for item in items:
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
                raise pytest.UsageError(
                    f"pytest-xdist did not group {item.nodeid}: this pytest and pytest-xdist "
                    "do not work together (pyproject.toml pins pytest for it)"
                )


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(_GroupCheck(), "corral-group-check")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = tier_of(report.nodeid)
    _work[tier] += report.duration
    _per_test[report.nodeid.rsplit("@", 1)[0]] += report.duration
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if start is not None and stop is not None:
        span = _span.setdefault(tier, [start, stop])
        span[0], span[1] = min(span[0], start), max(span[1], stop)
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _tests[tier] += 1


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """A worker's phases (the node tier's build and starts) join the controller's summary."""
    output = getattr(node, "workeroutput", None) or {}
    for tier, phases in json.loads(output.get("corral_tier_phases") or "{}").items():
        _phases[tier].extend((what, seconds, outside) for what, seconds, outside in phases)


def _run_started() -> float:
    try:
        return float(os.environ["CORRAL_RUN_STARTED"])
    except (KeyError, ValueError):
        return _started


def run_seconds() -> float:
    """Seconds since `make test` started (its builds and lint included), or since this
    process started when run outside it."""
    return time.time() - _run_started()


def over_budget() -> list[str]:
    over = []
    for tier, (start, stop) in _span.items():
        budget = TIER_BUDGETS.get(tier)
        if budget is not None and stop - start > budget:
            over.append(f"{tier} {stop - start:.0f}s > {budget:.0f}s")
    for tier, phases in _phases.items():
        outside = sum(s for _, s, out in phases if out)
        budget = OUTSIDE_BUDGETS.get(tier)
        if budget is not None and outside > budget:
            over.append(f"{tier} outside its tests {outside:.0f}s > {budget:.0f}s (cold build?)")
    return over


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _work and not _phases:
        return
    write = terminalreporter.write_line
    since = "make test" if "CORRAL_RUN_STARTED" in os.environ else "pytest"
    write(
        f"time per tier: wall-clock span (budget) and work, the sum of its tests' durations; "
        f"whole run {run_seconds():.1f}s since {since} started (budget {RUN_BUDGET:.0f}s warm, "
        f"limit {RUN_LIMIT:.0f}s):"
    )
    for tier in sorted(set(_work) | set(_phases)):
        start, stop = _span.get(tier, (0.0, 0.0))
        line = f"  {tier:<10} {stop - start:7.1f}s span, {_work.get(tier, 0.0):7.1f}s work"
        line += f" in {_tests.get(tier, 0)} tests"
        budget = TIER_BUDGETS.get(tier)
        line += f" (budget {budget:.0f}s)" if budget is not None else ""
        outside = sum(s for _, s, out in _phases.get(tier, []) if out)
        if outside:
            line += f" + {outside:.1f}s outside tests"
        write(line)
        if _phases.get(tier):
            parts = ", ".join(f"{what} {s:.1f}s" for what, s, _ in _phases[tier])
            write(f"  {'':<10} {parts}")
    write(f"the {SLOWEST} slowest tests (setup + call + teardown):")
    for nodeid, seconds in sorted(_per_test.items(), key=lambda kv: -kv[1])[:SLOWEST]:
        write(f"  {seconds:7.1f}s  {nodeid}")
    over = over_budget()
    if over:
        write("OVER BUDGET: " + "; ".join(over), yellow=True, bold=True)
    if run_seconds() > RUN_LIMIT:
        write(
            f"RUN TOO LONG: {run_seconds():.0f}s since {since} started, over the limit of "
            f"{RUN_LIMIT:.0f}s (CI stops at 5400s): the run fails",
            red=True,
            bold=True,
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller prints the summary
        workeroutput["corral_tier_phases"] = json.dumps(_phases)
        return
    if exitstatus != 0:
        return
    enforce = os.environ.get("CORRAL_ENFORCE_TIER_BUDGETS") == "1"
    if (enforce and over_budget()) or run_seconds() > RUN_LIMIT:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
