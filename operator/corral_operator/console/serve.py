"""Running the console: inside the operator process (its own thread, event loop and API client,
so a busy page never stalls a turn) or in the foreground for `corral console`."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import Any

import uvicorn

from ..archive.store import ArchiveStore
from ..kube import Kube
from ..wireclient import DEFAULT_MAX_ANSWER_BYTES
from .access import Access, ClusterAccess, KubeconfigAccess
from .app import build_app
from .changes import RemoteChanges
from .reader import Reader, Source

log = logging.getLogger("corral.console")


def parse_addr(text: str) -> tuple[str, int]:
    """HOST:PORT (or :PORT, meaning every address) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 0.0.0.0:8090)")
    return host or "0.0.0.0", int(port)


async def serve(access: Access, reader: Source, host: str, port: int, **app: Any) -> None:
    config = uvicorn.Config(
        build_app(access, reader, **app), host=host, port=port, log_level="warning",
        access_log=False, lifespan="off",
    )  # fmt: skip
    await uvicorn.Server(config).serve()


async def serve_cluster(
    kubeconfig: str | None,
    namespaces: tuple[str, ...] | None,
    host: str,
    port: int,
    harness_port: int,
    secure_cookie: bool = False,
    archive: ArchiveStore | None = None,
    max_history_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> None:
    """The in-cluster console: people by bearer token, reads with the console's identity."""
    kube = await Kube.connect(kubeconfig)
    access = ClusterAccess(kube)
    reader = Reader(
        kube, harness_port, namespaces, archive=archive, max_history_bytes=max_history_bytes
    )
    try:
        await serve(access, reader, host, port, secure_cookie=secure_cookie)
    finally:
        await access.aclose()
        await kube.close()


def start_in_operator(
    kubeconfig: str | None,
    namespaces: tuple[str, ...] | None,
    addr: str,
    harness_port: int,
    secure_cookie: bool = False,
    archive: ArchiveStore | None = None,
    max_history_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> threading.Thread:
    """The console on its own thread of the operator process. It dies with the process."""
    host, port = parse_addr(addr)

    def run() -> None:
        try:
            asyncio.run(
                serve_cluster(
                    kubeconfig,
                    namespaces,
                    host,
                    port,
                    harness_port,
                    secure_cookie,
                    archive,
                    max_history_bytes,
                )
            )
        except Exception:
            log.exception("the console stopped")

    thread = threading.Thread(target=run, name="corral-console", daemon=True)
    thread.start()
    log.info("console listening on %s:%d", host, port)
    return thread


async def serve_kubeconfig(
    kube: Kube, namespaces: tuple[str, ...] | None, host: str, port: int, harness_port: int
) -> None:
    """`corral console`: the person is the kubeconfig; the API server decides every read.
    Delivered work is fetched into the person's own cache directory."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    changes = RemoteChanges(cache / "corral" / "console-git")
    reader = Reader(kube, harness_port, namespaces, remote_changes=changes)
    await serve(KubeconfigAccess(kube), reader, host, port)
