"""The operator's Prometheus metrics, served at `/metrics` (`--metrics-addr`).

What a platform team asks of a fleet: how many Sessions are in each phase, how turns settle,
what they cost and in which tokens, what waits for a person, how long the operator takes to
reconcile and to admit, and how sandboxes start (a cold pod or one adopted from a warm pool).
docs/observability.md lists every series and how each is counted.

Gauges of state (sessions by phase, approvals pending) are computed at scrape time from what
the operator's watches last delivered, so they are right after a restart without any replay.
Counters count what this process saw since it started, as Prometheus expects: cost and tokens
are the increase of each Session's `status.usage` (the custodian's record, ADR 0062) over the
value this process first saw for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from corral_api.decisions import PENDING, approval_decision
from corral_api.kinds import SessionPhase, Usage

from .kopfext.collector import PAUSES

PHASES: tuple[str, ...] = get_args(SessionPhase)
# Reconcile passes take milliseconds; a pass that reads many children or Freezes, seconds.
_RECONCILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# An admission is one wire call; the first admission after `kubectl apply` includes the pod.
_ADMISSION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_FIRST_TURN_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
TOKEN_KINDS = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_read": "cache_read_tokens",
    "cache_write": "cache_write_tokens",
}


@dataclass(frozen=True)
class _Seen:
    phase: str
    agent: str
    usage: Usage


class _StateCollector(Collector):
    """Gauges from the last watched state: Sessions by phase, Approvals pending."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        sessions = GaugeMetricFamily(
            "corral_sessions", "Sessions by namespace and phase.", labels=["namespace", "phase"]
        )
        counts: dict[tuple[str, str], int] = {}
        namespaces: set[str] = set()
        for (namespace, _), seen in list(self._m.sessions.items()):
            namespaces.add(namespace)
            counts[(namespace, seen.phase)] = counts.get((namespace, seen.phase), 0) + 1
        for namespace in sorted(namespaces):
            for phase in PHASES:  # every phase, zeros too: a dashboard's series never vanish
                sessions.add_metric([namespace, phase], counts.get((namespace, phase), 0))
        yield sessions
        pending = GaugeMetricFamily(
            "corral_approvals_pending",
            "Approvals that wait for a person's decision, by namespace.",
            labels=["namespace"],
        )
        by_namespace: dict[str, int] = {}
        for (namespace, _), waiting in list(self._m.approvals.items()):
            by_namespace[namespace] = by_namespace.get(namespace, 0) + int(waiting)
        for namespace, count in sorted(by_namespace.items()):
            pending.add_metric([namespace], count)
        yield pending
        yield from _collector_pauses()
        if self._m.write_slots is not None:
            queued, sending = self._m.write_slots()
            yield GaugeMetricFamily(
                "corral_api_writes_waiting",
                "Updates and deletes waiting for one of the --api-writes-in-flight slots.",
                value=queued,
            )
            yield GaugeMetricFamily(
                "corral_api_writes_in_flight",
                "Updates and deletes sent to the API server and not yet answered.",
                value=sending,
            )


def _collector_pauses() -> Iterator[Metric]:
    """The garbage collector's pauses (collector.PAUSES): each one stops the event loop."""
    seconds = CounterMetricFamily(
        "corral_gc_pause_seconds",
        "Time the operator was stopped by CPython's garbage collector, by generation.",
        labels=["generation"],
    )
    for generation, total in enumerate(PAUSES.seconds):
        seconds.add_metric([str(generation)], total)
    yield seconds
    collections = CounterMetricFamily(
        "corral_gc_collections", "Collections by generation.", labels=["generation"]
    )
    for generation, count in enumerate(PAUSES.collections):
        collections.add_metric([str(generation)], count)
    yield collections
    yield GaugeMetricFamily(
        "corral_gc_longest_pause_seconds",
        "The longest single collection since the operator started.",
        value=PAUSES.longest,
    )


class OperatorMetrics:
    """Every series the operator exports, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # (namespace, name) -> what the Session watch last said; (namespace, name) -> pending.
        self.sessions: dict[tuple[str, str], _Seen] = {}
        self.approvals: dict[tuple[str, str], bool] = {}
        # The API adapter's write slots, (waiting, sending), once the operator has connected.
        self.write_slots: Callable[[], tuple[int, int]] | None = None
        r.register(_StateCollector(self))
        # 1 where kopf runs (the leader), 0 on a standby (standby.py sets it).
        self.leader = Gauge(
            "corral_operator_leader",
            "1 on the replica that leads (drives Sessions), 0 on a standby (ADR 0103).",
            ["identity"],
            registry=r,
        )
        self.settlements = Counter(
            "corral_turn_settlements",
            "Turns settled, by namespace, Agent and settlement status.",
            ["namespace", "agent", "status"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "corral_reconcile_duration_seconds",
            "One observe-plan-apply pass of a resource (a turn in flight is not part of it).",
            ["kind"],
            buckets=_RECONCILE_BUCKETS,
            registry=r,
        )
        self.admission_seconds = Histogram(
            "corral_admission_duration_seconds",
            "The wire's admission call: from sending a turn to the harness accepting it.",
            ["namespace"],
            buckets=_ADMISSION_BUCKETS,
            registry=r,
        )
        self.first_turn_seconds = Histogram(
            "corral_session_first_turn_seconds",
            "From a Session's creation to its first turn admitted (sandbox start included).",
            ["namespace"],
            buckets=_FIRST_TURN_BUCKETS,
            registry=r,
        )
        self.cost = Counter(
            "corral_cost_usd",
            "Model cost in USD as the custodians recorded it, by namespace and Agent.",
            ["namespace", "agent"],
            registry=r,
        )
        self.tokens = Counter(
            "corral_tokens",
            "Model tokens as the custodians recorded them, by namespace, Agent and kind.",
            ["namespace", "agent", "kind"],
            registry=r,
        )
        self.pods_started = Counter(
            "corral_sandbox_pods_started",
            "Sandbox pods a Session started on: created cold, or adopted from a warm pool.",
            ["namespace", "source"],
            registry=r,
        )
        self._server: Any = None

    # ------------------------------------------------------------------ the watches' view

    def session_seen(self, namespace: str, name: str, body: dict[str, Any], *, new: bool) -> None:
        """A Session as a watch event carried it. `new`: it was just created, so everything it
        spent is counted; otherwise the first sight is only the baseline (a restart must not
        count again what an earlier process counted)."""
        status = body.get("status") or {}
        agent = str((body.get("spec") or {}).get("agentRef") or "")
        usage = Usage.model_validate(status.get("usage") or {})
        key = (namespace, name)
        before = self.sessions.get(key)
        self.sessions[key] = _Seen(str(status.get("phase") or "Pending"), agent, usage)
        if before is None and not new:
            return
        base = before.usage if before is not None else Usage()
        grew = usage.cost - base.cost
        if grew > 0:
            self.cost.labels(namespace, agent).inc(grew)
        for kind, field in TOKEN_KINDS.items():
            more = getattr(usage, field) - getattr(base, field)
            if more > 0:
                self.tokens.labels(namespace, agent, kind).inc(more)

    def session_gone(self, namespace: str, name: str) -> None:
        self.sessions.pop((namespace, name), None)

    def approval_seen(self, namespace: str, name: str, body: dict[str, Any] | None) -> None:
        """An Approval as a watch event carried it (None: deleted)."""
        if body is None:
            self.approvals.pop((namespace, name), None)
            return
        self.approvals[(namespace, name)] = approval_decision(body) == PENDING

    # ---------------------------------------------------------------- the turn driver's view

    def driver_event(
        self, namespace: str, agent: str, event: dict[str, Any], created: str = ""
    ) -> None:
        """One of the turn driver's events: a settlement counts; the first admission of a
        Session observes how long it took from the Session's creation (`created`, RFC 3339)."""
        if event.get("source") != "driver":
            return
        kind = event.get("type")
        if kind == "settled":
            self.settlements.labels(namespace, agent, str(event.get("status"))).inc()
        elif kind == "admitted" and event.get("turn") == 1 and created:
            # Only the first admission ever: its run id has no freeze suffix (`.1`, not `.1-f1`).
            if not str(event.get("runId") or ".1").endswith(".1"):
                return
            try:
                since = datetime.fromisoformat(created.replace("Z", "+00:00"))
            except ValueError:
                return
            seconds = (datetime.now(UTC) - since).total_seconds()
            self.first_turn_seconds.labels(namespace).observe(max(seconds, 0.0))

    # ----------------------------------------------------------------------- the server

    def serve(self, address: str) -> None:
        """Serve `/metrics` on HOST:PORT from a thread of its own (never the event loop)."""
        host, _, port = address.rpartition(":")
        server, thread = start_http_server(int(port), host or "0.0.0.0", registry=self.registry)
        self._server = (server, thread)

    def close(self) -> None:
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._server = None


def parse_address(text: str) -> str:
    """HOST:PORT or :PORT, checked; '' stays '' (no server)."""
    if not text:
        return ""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 0.0.0.0:9090)")
    return f"{host or '0.0.0.0'}:{port}"
