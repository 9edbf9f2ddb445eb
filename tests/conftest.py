"""Which tier spent what: at the end of every run, the time of each tier (tests/<tier>/), the
sum of its tests' setup, call and teardown (session fixtures are charged to the test that first
needs them), against the tier's budget; plus any phase a tier ran outside its tests (the node
tier builds the node and images after collection, before the first test).

The budgets are for CI's 2-core machine with warm caches (docs/operations.md has the cold and
warm figures). A tier over its budget is named at the end of the run; with
CORRAL_ENFORCE_TIER_BUDGETS=1 it also fails the run.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Any

import pytest

# Seconds, per tier, warm caches (a cold machine adds the builds, which are shown apart).
TIER_BUDGETS: dict[str, float] = {
    "unit": 240,
    "wire": 240,
    "e2e_local": 240,
    "cluster": 1500,
    "attack": 300,
    "node": 300,
}
# Phases run outside any test, per tier, on a warm machine: the node tier's build rebuilds
# Corral's two images when a source file they copy changed (~100-130 s), else ~1 s. A cold
# build (~23 min: docs/operations.md) is over it and says so.
OUTSIDE_BUDGETS: dict[str, float] = {"node": 300}

_spent: dict[str, float] = defaultdict(float)
_tests: dict[str, int] = defaultdict(int)
_phases: dict[str, list[tuple[str, float, bool]]] = defaultdict(list)
_started = time.monotonic()


def record_tier_time(tier: str, what: str, seconds: float, *, outside_tests: bool = False) -> None:
    """A named phase of `tier` for the summary; `outside_tests` adds it to the tier's total
    (a phase inside a fixture is already in the test durations)."""
    _phases[tier].append((what, seconds, outside_tests))


def tier_of(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    if len(parts) > 2 and parts[0] == "tests":
        return parts[1]
    return "other"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = tier_of(report.nodeid)
    _spent[tier] += report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _tests[tier] += 1


def over_budget() -> list[str]:
    over = []
    for tier, spent in _spent.items():
        budget = TIER_BUDGETS.get(tier)
        if budget is not None and spent > budget:
            over.append(f"{tier} {spent:.0f}s > {budget:.0f}s")
    for tier, phases in _phases.items():
        outside = sum(s for _, s, out in phases if out)
        budget = OUTSIDE_BUDGETS.get(tier)
        if budget is not None and outside > budget:
            over.append(f"{tier} outside its tests {outside:.0f}s > {budget:.0f}s (cold build?)")
    return over


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _spent and not _phases:
        return
    write = terminalreporter.write_line
    write(f"time per tier (budget), whole run {time.monotonic() - _started:.1f}s:")
    for tier in sorted(set(_spent) | set(_phases)):
        spent = _spent.get(tier, 0.0)
        budget = TIER_BUDGETS.get(tier)
        line = f"  {tier:<10} {spent:7.1f}s in {_tests.get(tier, 0)} tests"
        line += f" (budget {budget:.0f}s)" if budget is not None else ""
        outside = sum(s for _, s, out in _phases.get(tier, []) if out)
        if outside:
            line += f" + {outside:.1f}s outside tests"
        write(line)
        if _phases.get(tier):
            parts = ", ".join(f"{what} {s:.1f}s" for what, s, _ in _phases[tier])
            write(f"  {'':<10} {parts}")
    over = over_budget()
    if over:
        write("OVER BUDGET: " + "; ".join(over), yellow=True, bold=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CORRAL_ENFORCE_TIER_BUDGETS") == "1" and over_budget() and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
