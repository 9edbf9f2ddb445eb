"""What the operator's metrics read from the Session watch: phases, cost and tokens.

A watch event handler (no kopf annotations written, no API call made): each event updates the
in-memory view the `/metrics` scrape reads (docs/observability.md).
"""

from __future__ import annotations

from typing import Any

import kopf

from corral_api import GROUP, VERSION

from ._common import plain, runtime


@kopf.on.event(GROUP, VERSION, "sessions")
async def session_observed(
    type: str | None,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    # async: a plain def would cost a thread-pool hop per Session event.
    if not namespace:
        return
    metrics = runtime(memo).metrics
    if type == "DELETED":
        metrics.session_gone(namespace, name)
        return
    # ADDED is a Session created while this process watches: all it spends is counted. The
    # initial listing (type None) is only the baseline another process may have counted.
    metrics.session_seen(namespace, name, plain(body), new=type == "ADDED")
