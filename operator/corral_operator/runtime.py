"""What the handlers share inside one operator process: the API client, settings, wake-ups."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import kopf

from . import naming
from .archive.store import ArchiveStore
from .egressrecords import EgressRecords
from .kube import Kube, corral_path
from .metrics import OperatorMetrics
from .planning.session import PlannedEvent
from .settings import OperatorSettings

log = logging.getLogger("corral.operator")


# A sandbox's pool that has not started a request for this long is closed. Longer than any wire
# call can take (a check's 300 s plus its margin), so no request in flight loses its pool.
IDLE_POOL_SECONDS = 600.0


class SharedTransport(httpx.AsyncBaseTransport):
    """The connection pools of every Session's wire client: one small pool per sandbox
    address, all sharing one TLS context.

    An httpx client builds its own TLS context and pool, and with hundreds of Sessions those
    were most of the operator's memory, so clients close and the pools stay; one pool for all
    addresses was no better, since each request scans every connection of its pool
    (docs/performance.md, "1,000 Sessions", item 5).
    """

    def __init__(self) -> None:
        self._tls = ssl.create_default_context()
        self._pools: dict[tuple[bytes, bytes, int | None], httpx.AsyncHTTPTransport] = {}
        self._last_used: dict[tuple[bytes, bytes, int | None], float] = {}
        self._swept = time.monotonic()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = (request.url.raw_scheme, request.url.raw_host, request.url.port)
        pool = self._pools.get(key)
        if pool is None:
            await self._close_idle()
            pool = self._pools[key] = httpx.AsyncHTTPTransport(
                verify=self._tls,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=8),
            )
        self._last_used[key] = time.monotonic()
        return await pool.handle_async_request(request)

    async def _close_idle(self) -> None:
        now = time.monotonic()
        if now - self._swept < IDLE_POOL_SECONDS / 10:
            return
        self._swept = now
        for key, used in list(self._last_used.items()):
            if now - used > IDLE_POOL_SECONDS:
                del self._last_used[key]
                await self._pools.pop(key).aclose()

    async def aclose(self) -> None:
        """A client closing does not close the pools the others use."""

    async def close_pool(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        self._last_used.clear()
        for pool in pools:
            await pool.aclose()


# How long an object seen on a watch stands in for a GET. Every change arrives as an event well
# within this; the bound covers an event lost while a watch reconnects (a relist sends no
# DELETED), after which the next read goes to the API server again.
WATCHED_FRESH_SECONDS = 30.0


@dataclass
class WatchedObjects:
    """The last body each watch event carried, by (namespace, name), for at most
    WATCHED_FRESH_SECONDS. A Session's pass reads its Agent and its pod here instead of asking
    the API server each time: with 1,000 Sessions those GETs were most of the operator's
    requests (docs/performance.md, "1,000 Sessions")."""

    # What is kept of a body (None: all of it).
    keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    _seen: dict[tuple[str, str], tuple[float, dict[str, Any]]] = field(default_factory=dict)

    def saw(self, namespace: str, name: str, body: dict[str, Any] | None) -> bool:
        """Record an event's body; None (a deletion) forgets the object. True when what is
        kept changed (a pod's binding or a kubelet's heartbeat changes nothing a pass reads)."""
        before = self._seen.get((namespace, name))
        if body is None:
            self._seen.pop((namespace, name), None)
            return before is not None
        kept = self.keep(body) if self.keep is not None else body
        self._seen[(namespace, name)] = (time.monotonic(), kept)
        return before is None or before[1] != kept

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The body last seen, if seen recently enough; None means "ask the API server"."""
        found = self._seen.get((namespace, name))
        if found is None or time.monotonic() - found[0] > WATCHED_FRESH_SECONDS:
            return None
        return found[1]


_POD_METADATA = (
    "name", "namespace", "uid", "labels", "annotations", "ownerReferences", "deletionTimestamp",
)  # fmt: skip
_POD_STATUS = ("phase", "podIP", "podIPs", "conditions")


def pod_essentials(pod: dict[str, Any]) -> dict[str, Any]:
    """What a Session's pass reads of its pod (owner, deletion, address, readiness): whole pods
    kept for every Session cost the operator memory (docs/performance.md, item 2)."""
    md, status = pod.get("metadata") or {}, pod.get("status") or {}
    return {
        "apiVersion": pod.get("apiVersion", "v1"),
        "kind": pod.get("kind", "Pod"),
        "metadata": {k: md[k] for k in _POD_METADATA if k in md},
        "status": {k: status[k] for k in _POD_STATUS if k in status},
    }


# How often the Freeze cache of a namespace is listed afresh. Watch events keep it current in
# between; the relist bounds what a lost DELETED (a watch reconnecting) could leave behind.
FREEZE_RELIST_SECONDS = 60.0


@dataclass
class FreezeCache:
    """The Freezes of each namespace, as a list read on first use and the operator's Freeze
    watch since, listed afresh every FREEZE_RELIST_SECONDS.

    A Session's pass reads them here: one LIST per pass of every Session was the second
    commonest request of a 1,000-Session burst (docs/performance.md). The first read of a
    namespace always goes to the API server, so an operator that just started misses no
    freeze; the custodian refuses a frozen Session's model calls on its own reading anyway.
    """

    _items: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    _listed: dict[str, float] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def saw(self, namespace: str, name: str, body: dict[str, Any] | None) -> None:
        """A watch event: ignored until the namespace was listed once (that list sees it)."""
        items = self._items.get(namespace)
        if items is None:
            return
        if body is None:
            items.pop(name, None)
        else:
            items[name] = body

    async def freezes(self, kube: Kube, namespace: str) -> list[dict[str, Any]]:
        if time.monotonic() - self._listed.get(namespace, -1e9) > FREEZE_RELIST_SECONDS:
            async with self._lock:  # 1,000 first passes at once make one LIST, not 1,000
                if time.monotonic() - self._listed.get(namespace, -1e9) > FREEZE_RELIST_SECONDS:
                    listed = await kube.list(corral_path("Freeze", namespace))
                    self._items[namespace] = {
                        str(item["metadata"]["name"]): item for item in listed
                    }
                    self._listed[namespace] = time.monotonic()
        return list(self._items.get(namespace, {}).values())


@dataclass
class Runtime:
    kube: Kube
    settings: OperatorSettings
    # Agents and sandbox pods as the operator's own watches last delivered them.
    agents: WatchedObjects = field(default_factory=WatchedObjects)
    pods: WatchedObjects = field(default_factory=lambda: WatchedObjects(keep=pod_essentials))
    # One event per Session (namespace, session label value): set when its pod or Agent
    # changed, so the Session's loop looks again at once instead of polling.
    _wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    # Drivers with a turn in flight, so a deletion can abort the turn first.
    drivers: dict[tuple[str, str], Any] = field(default_factory=dict)
    wire_transport: SharedTransport = field(default_factory=SharedTransport)
    freezes: FreezeCache = field(default_factory=FreezeCache)
    # Wire tokens this process wrote into Sessions' Secrets, by (namespace, name): (uid, token).
    # Read back from the Secret only by an operator that did not write it (after a restart).
    wire_tokens: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    # The Prometheus series the handlers feed (docs/observability.md).
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    # Where finished Sessions are archived before their pods go (docs/history.md); None: off.
    archive: ArchiveStore | None = None
    # The egress gateway's decisions by Session, read by the operator's poll (docs/egress.md).
    egress: EgressRecords = field(default_factory=EgressRecords)

    def wakeup(self, namespace: str, session: str) -> asyncio.Event:
        key = (namespace, naming.label_value(session))
        event = self._wakeups.get(key)
        if event is None:
            event = self._wakeups[key] = asyncio.Event()
        return event

    def forget(self, namespace: str, session: str) -> None:
        self._wakeups.pop((namespace, naming.label_value(session)), None)
        self.wire_tokens.pop((namespace, session), None)

    def wake(self, namespace: str, session_label: str) -> None:
        event = self._wakeups.get((namespace, session_label))
        if event is not None:
            event.set()

    def wake_namespace(self, namespace: str) -> None:
        for (ns, _), event in self._wakeups.items():
            if ns == namespace:
                event.set()


def post_event(body: dict[str, Any], event: PlannedEvent) -> None:
    """A Kubernetes Event on `body`; kopf queues and posts it (never blocks the caller)."""
    ref = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {k: body.get("metadata", {}).get(k) for k in ("name", "namespace", "uid")},
    }
    try:
        kopf.event(ref, type=event.type, reason=event.reason, message=event.message)  # type: ignore[arg-type]
    except Exception:  # posting is best effort; a lost Event must not stop a turn
        log.exception("could not post event %s", event.reason)
