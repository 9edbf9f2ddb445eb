"""Session: a daemon per Session runs its loop; a deletion aborts the turn in flight first.

The abort happens as the daemon stops (kopf holds a daemon's resource by its finalizer until
the daemon has exited), not in a deletion handler: a change handler would make kopf keep a
diff-base annotation on every Session and compute its essence on every event, a write and
much of the operator's CPU per Session at 1,000 Sessions (docs/performance.md).
"""

from __future__ import annotations

from typing import Any

import kopf

from corral_api import GROUP, VERSION

from .. import naming
from ..planning.session import PlannedEvent
from ..runtime import post_event
from ..session.loop import SessionLoop, abort_turn
from ._common import namespace_of, plain, runtime

DELETED = kopf.DaemonStoppingReason.RESOURCE_DELETED


# The stop flag first, cancellation only after 10 s: the loop stops at the flag, then aborts
# the turn in flight if the Session is being deleted (kopf would otherwise cancel at once).
@kopf.daemon(GROUP, VERSION, "sessions", cancellation_backoff=10.0, cancellation_timeout=10.0)
async def session_daemon(
    body: kopf.Body,
    name: str,
    namespace: str | None,
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    loop = SessionLoop(runtime(memo), namespace_of(namespace), name, live=body)
    await loop.run(stopped)
    if stopped.reason is not None and stopped.reason & DELETED:
        last = plain(body)
        if await abort_turn(runtime(memo), await loop.last_known() or last):
            post_event(last, PlannedEvent("Normal", "TurnAborted", "aborted before deletion"))


@kopf.on.event(GROUP, VERSION, "sessions")
async def session_changed(
    type: str | None, body: kopf.Body, name: str, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    """A suspend or a resume asked for wakes the Session's loop at once (its driver, mid-turn),
    instead of at its next recheck."""
    if type != "MODIFIED" or not namespace:
        return
    wanted = bool((body.get("spec") or {}).get("suspend"))
    if wanted != ((body.get("status") or {}).get("phase") == "Suspended"):
        runtime(memo).wake(namespace, naming.label_value(name))


@kopf.on.event(
    "",
    "v1",
    "pods",
    labels={naming.LABEL_MANAGED_BY: naming.MANAGED_BY, naming.LABEL_COMPONENT: "sandbox"},
)
async def sandbox_pod_changed(
    type: str | None,
    body: kopf.Body,
    labels: kopf.Labels,
    name: str,
    namespace: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    # async: a plain def would cost a thread-pool hop per pod event.
    rt = runtime(memo)
    if not namespace:
        return
    gone = type == "DELETED"
    changed = rt.pods.saw(namespace, name, None if gone else plain(body))
    session = labels.get(naming.LABEL_SESSION)
    # Only a change a pass reads wakes the Session (a binding or a new node name does not).
    if session and changed:
        rt.wake(namespace, session)
