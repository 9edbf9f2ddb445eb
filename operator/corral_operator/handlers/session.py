"""Session: a daemon per Session runs its loop; a deletion aborts the turn in flight first."""

from __future__ import annotations

from typing import Any

import kopf

from corral_api import GROUP, VERSION

from .. import naming
from ..planning.session import PlannedEvent
from ..runtime import post_event
from ..sessionloop import SessionLoop, abort_turn
from ._common import plain, runtime


@kopf.daemon(GROUP, VERSION, "sessions", cancellation_timeout=10.0)
async def session_daemon(**kw: Any) -> None:
    await SessionLoop(runtime(kw["memo"]), kw["namespace"], kw["name"]).run(kw["stopped"])


@kopf.on.delete(GROUP, VERSION, "sessions")
async def session_deleted(**kw: Any) -> None:
    body = plain(kw["body"])
    if await abort_turn(runtime(kw["memo"]), body):
        post_event(body, PlannedEvent("Normal", "TurnAborted", "aborted before deletion"))


@kopf.on.event(
    "",
    "v1",
    "pods",
    labels={naming.LABEL_MANAGED_BY: naming.MANAGED_BY, naming.LABEL_COMPONENT: "sandbox"},
)
async def sandbox_pod_changed(**kw: Any) -> None:
    # async: a plain def would cost a thread-pool hop per pod event.
    rt = runtime(kw["memo"])
    if kw["namespace"]:
        gone = kw["type"] == "DELETED"
        rt.pods.saw(kw["namespace"], kw["name"], None if gone else plain(kw["body"]))
    session = kw["labels"].get(naming.LABEL_SESSION)
    if session and kw["namespace"]:
        rt.wake(kw["namespace"], session)
