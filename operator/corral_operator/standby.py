"""An operator replica that does not lead: it serves what every replica serves (liveness and
readiness, `/metrics`, the archive reader; the console runs on its own thread from `main`)
and waits for the Lease (ADR 0103). Once it leads, it stops these servers and `main` runs
kopf, whose startup serves them again: a second or so in which this replica answers nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from .archive.server import RunningReader, start_archive_reader
from .archive.store import ArchiveStore
from .kube import Kube
from .leadership import LeaseElector
from .metrics import OperatorMetrics
from .session.wiretoken import read_wire_token

log = logging.getLogger("corral.operator.standby")


@dataclass(frozen=True)
class StandbyServing:
    """Where this replica serves while it waits ('' / None: not served)."""

    liveness: str
    metrics_addr: str
    archive_listen: tuple[str, int] | None
    kubeconfig: str | None
    archive: ArchiveStore | None
    harness_port: int
    max_history_bytes: int


async def stand_by(elector: LeaseElector, serving: StandbyServing) -> float:
    """Serve until `elector` holds its Lease; the seconds it waited."""
    stops: list[Callable[[], Awaitable[None]]] = []
    try:
        if serving.liveness:
            stops.append((await _serve_liveness(serving.liveness, elector)).cleanup)
        if serving.metrics_addr:
            stops.append(_serve_metrics(serving.metrics_addr, elector.identity))
        if serving.archive_listen is not None:
            kube = await Kube.connect(serving.kubeconfig)
            stops.append(kube.close)
            stops.append((await _serve_archive(kube, serving)).cleanup)
        log.info("standby: %s waits for lease %s", elector.identity, elector.path)
        return await elector.acquire()
    finally:
        for stop in reversed(stops):
            await stop()


async def _serve_liveness(url: str, elector: LeaseElector) -> web.AppRunner:
    """The liveness URL kopf serves once leading, answered here meanwhile: a standby is alive
    and ready (it serves the console and the reader), and says who leads."""
    parts = urlsplit(url)

    async def health(_: web.Request) -> web.Response:
        body = {"role": "standby", "identity": elector.identity, "leader": elector.holder}
        return web.Response(text=json.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_get(parts.path or "/", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, parts.hostname or "0.0.0.0", parts.port or 80).start()
    return runner


def _serve_metrics(address: str, identity: str) -> Callable[[], Awaitable[None]]:
    """The operator's `/metrics`, as a standby has them (no Session seen, the leader gauge at
    0); its stop."""
    metrics = OperatorMetrics()
    metrics.leader.labels(identity).set(0)
    metrics.serve(address)

    async def stop() -> None:
        metrics.close()

    return stop


async def _serve_archive(kube: Kube, serving: StandbyServing) -> RunningReader:
    assert serving.archive_listen is not None

    async def token(namespace: str, name: str, uid: str) -> str:
        return await read_wire_token(kube, namespace, name, uid)

    host, port = serving.archive_listen
    return await start_archive_reader(
        kube,
        serving.archive,
        host,
        port,
        harness_port=serving.harness_port,
        read_token=token,
        max_history_bytes=serving.max_history_bytes,
    )
