"""The operator's metrics: what each series counts, and `/metrics` served over real HTTP.

The cluster test (tests/cluster/test_observability.py) scrapes a real operator; these pin the
counting rules a scrape cannot isolate: a restart does not count again what an earlier process
counted, gauges show every phase, a Session's first admission is timed once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from corral_dev.ports import free_port
from corral_operator.metrics import PHASES, OperatorMetrics, parse_address


def _session(
    phase: str, cost: float = 0.0, output: int = 0, agent: str = "coder"
) -> dict[str, Any]:
    return {
        "spec": {"agentRef": agent},
        "status": {"phase": phase, "usage": {"cost": cost, "outputTokens": output}},
    }


def _samples(metrics: OperatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return _samples(metrics).get((name, tuple(sorted(labels.items()))))


def test_sessions_by_phase_show_every_phase_of_a_namespace_and_follow_deletions() -> None:
    m = OperatorMetrics()
    m.session_seen("a", "one", _session("Running"), new=True)
    m.session_seen("a", "two", _session("Running"), new=True)
    m.session_seen("b", "three", _session("Succeeded"), new=False)
    assert _value(m, "corral_sessions", namespace="a", phase="Running") == 2
    assert _value(m, "corral_sessions", namespace="a", phase="Failed") == 0
    assert {
        p for (n, lbl) in _samples(m) if n == "corral_sessions" for k, p in lbl if k == "phase"
    } == set(PHASES)
    m.session_seen("a", "one", _session("Succeeded"), new=False)
    m.session_gone("a", "two")
    assert _value(m, "corral_sessions", namespace="a", phase="Running") == 0
    assert _value(m, "corral_sessions", namespace="a", phase="Succeeded") == 1


def test_cost_and_tokens_count_increases_and_a_restart_only_takes_a_baseline() -> None:
    m = OperatorMetrics()
    # Created while this process watches: all of it counts.
    m.session_seen("a", "new", _session("Running", cost=0.5, output=100), new=True)
    # Seen first in the initial listing (an earlier process counted what it had spent).
    m.session_seen("a", "old", _session("Running", cost=7.0, output=9000, agent="rev"), new=False)
    assert _value(m, "corral_cost_usd_total", namespace="a", agent="coder") == pytest.approx(0.5)
    assert _value(m, "corral_cost_usd_total", namespace="a", agent="rev") is None
    m.session_seen("a", "old", _session("Running", cost=7.25, output=9040, agent="rev"), new=False)
    m.session_seen("a", "new", _session("Running", cost=0.75, output=150), new=False)
    m.session_seen("a", "new", _session("Running", cost=0.75, output=150), new=False)  # no change
    assert _value(m, "corral_cost_usd_total", namespace="a", agent="rev") == pytest.approx(0.25)
    assert _value(m, "corral_cost_usd_total", namespace="a", agent="coder") == pytest.approx(0.75)
    tokens = _value(m, "corral_tokens_total", namespace="a", agent="coder", kind="output")
    assert tokens == 150
    assert _value(m, "corral_tokens_total", namespace="a", agent="rev", kind="output") == 40


def test_approvals_pending_counts_undecided_ones_until_they_are_decided_or_gone() -> None:
    m = OperatorMetrics()
    m.approval_seen("a", "x", {"spec": {}})
    m.approval_seen("a", "y", {"spec": {}, "status": {"decision": "Pending"}})
    m.approval_seen("b", "z", {"spec": {}, "status": {"decision": "Denied"}})
    assert _value(m, "corral_approvals_pending", namespace="a") == 2
    assert _value(m, "corral_approvals_pending", namespace="b") == 0
    m.approval_seen("a", "x", {"spec": {}, "status": {"decision": "Approved"}})
    m.approval_seen("a", "y", None)
    assert _value(m, "corral_approvals_pending", namespace="a") == 0


def test_settlements_count_by_status_and_only_the_first_admission_is_timed_from_creation() -> None:
    m = OperatorMetrics()
    created = (datetime.now(UTC) - timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    driver = {"source": "driver"}
    m.driver_event("a", "coder", {**driver, "type": "admitted", "turn": 1, "runId": "s.1"}, created)
    m.driver_event("a", "coder", {**driver, "type": "settled", "status": "completed"}, created)
    m.driver_event("a", "coder", {**driver, "type": "admitted", "turn": 2, "runId": "s.2"}, created)
    # A first turn continued after a freeze is not a first admission.
    m.driver_event(
        "a", "coder", {**driver, "type": "admitted", "turn": 1, "runId": "s.1-f1"}, created
    )
    m.driver_event("a", "coder", {**driver, "type": "settled", "status": "failed"}, created)
    m.driver_event("a", "coder", {"type": "settled", "status": "failed"}, created)  # wire chatter
    assert (
        _value(m, "corral_turn_settlements_total", namespace="a", agent="coder", status="completed")
        == 1
    )
    assert (
        _value(m, "corral_turn_settlements_total", namespace="a", agent="coder", status="failed")
        == 1
    )
    assert _value(m, "corral_session_first_turn_seconds_count", namespace="a") == 1
    waited = _value(m, "corral_session_first_turn_seconds_sum", namespace="a")
    assert waited is not None and 2.5 < waited < 60


def test_metrics_are_served_over_http_and_the_server_stops() -> None:
    m = OperatorMetrics()
    m.session_seen("a", "one", _session("Running", cost=1.5), new=True)
    m.reconcile_seconds.labels("Session").observe(0.004)
    port = free_port()
    m.serve(f"127.0.0.1:{port}")
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert answer.status_code == 200
        assert 'corral_sessions{namespace="a",phase="Running"} 1.0' in answer.text
        assert 'corral_cost_usd_total{agent="coder",namespace="a"} 1.5' in answer.text
        assert 'corral_reconcile_duration_seconds_count{kind="Session"} 1.0' in answer.text
    finally:
        m.close()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


@pytest.mark.parametrize(
    ("given", "wanted"), [("", ""), (":9090", "0.0.0.0:9090"), ("127.0.0.1:1", "127.0.0.1:1")]
)
def test_a_metrics_address_is_checked(given: str, wanted: str) -> None:
    assert parse_address(given) == wanted


@pytest.mark.parametrize("bad", ["9090", "host:", "h:0", "h:70000", "h:port"])
def test_a_bad_metrics_address_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address(bad)
