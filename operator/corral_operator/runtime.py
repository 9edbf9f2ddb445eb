"""What the handlers share inside one operator process: the API client, settings, wake-ups."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx
import kopf

from . import naming
from .kube import Kube
from .planning.session import PlannedEvent
from .settings import OperatorSettings

log = logging.getLogger("corral.operator")


class SharedTransport(httpx.AsyncBaseTransport):
    """One connection pool for every Session's wire client.

    An httpx client builds its own TLS context and pool (about 1.5 MB each); with hundreds of
    Sessions that is most of the operator's memory. Clients close, the shared pool stays.
    """

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64)
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        """A client closing does not close the pool the others use."""

    async def close_pool(self) -> None:
        await self._inner.aclose()


@dataclass
class Runtime:
    kube: Kube
    settings: OperatorSettings
    # One event per Session (namespace, session label value): set when its pod or Agent
    # changed, so the Session's loop looks again at once instead of polling.
    _wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    # Drivers with a turn in flight, so a deletion can abort the turn first.
    drivers: dict[tuple[str, str], Any] = field(default_factory=dict)
    wire_transport: SharedTransport = field(default_factory=SharedTransport)

    def wakeup(self, namespace: str, session: str) -> asyncio.Event:
        key = (namespace, naming.label_value(session))
        event = self._wakeups.get(key)
        if event is None:
            event = self._wakeups[key] = asyncio.Event()
        return event

    def forget(self, namespace: str, session: str) -> None:
        self._wakeups.pop((namespace, naming.label_value(session)), None)

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
