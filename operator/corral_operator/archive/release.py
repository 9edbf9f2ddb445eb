"""The step before a sandbox pod goes: archive its Session, bounded in time.

The pod is released only once its Session is archived, or once the archive deadline after
the Session finished has passed (the condition `Archived` then says `ArchiveFailed` and an Event
says why): a broken archive never keeps a pod, or a deletion, waiting forever. A history larger
than the operator's cap is archived as its record alone, at once (`HistoryTooLarge`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from corral_api.kinds import SessionStatus
from corral_kube import KubeError

from ..driver import WireFault
from ..kube import Kube
from ..planning import reasons as R
from ..planning.conditions import get_condition, set_condition
from ..planning.session import PlannedEvent, now_text, parse_time
from ..wireclient import DEFAULT_MAX_ANSWER_BYTES
from .capture import archive_from_harness
from .store import ArchiveStore

log = logging.getLogger("corral.operator.archive")

ARCHIVED = "Archived"  # the condition's type
ARCHIVE_RETRY = 5.0


@dataclass(frozen=True)
class Release:
    """May the pod go now; the status to write (the `Archived` condition), if any; an Event."""

    release: bool
    status: dict[str, Any] | None = None
    event: PlannedEvent | None = None
    retry_after: float | None = None


def archived_already(status: dict[str, Any]) -> bool:
    """True once the archive was written or given up on: it is not tried twice."""
    cond = get_condition(SessionStatus.model_validate(status).conditions, ARCHIVED)
    return cond is not None


def _with_condition(
    status: dict[str, Any], ok: bool, reason: str, message: str, generation: int
) -> dict[str, Any]:
    parsed = SessionStatus.model_validate(status)
    conds = set_condition(
        parsed.conditions,
        ARCHIVED,
        "True" if ok else "False",
        reason,
        message,
        now=now_text(datetime.now(UTC)),
        generation=generation,
    )
    return {"conditions": parsed.model_copy(update={"conditions": conds}).wire()["conditions"]}


async def archive_before_release(
    kube: Kube,
    store: ArchiveStore,
    body: dict[str, Any],
    status: dict[str, Any],
    pod_path: str,
    read_token: Callable[[], Awaitable[str]],
    *,
    harness_port: int,
    deadline_seconds: float,
    cause: str,
    transport: httpx.AsyncBaseTransport | None = None,
    max_history_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> Release:
    """Archive the Session (with `status`, what the operator just wrote) from its pod."""
    generation = int(body["metadata"].get("generation") or 0)
    pod = await kube.get(pod_path)
    ip = ((pod or {}).get("status") or {}).get("podIP")
    session = {**body, "status": status}
    try:
        if pod is not None and not ip:
            raise LookupError(f"the pod {pod_path.rpartition('/')[2]} has no address")
        url = f"http://{ip}:{harness_port}" if ip else None
        token = await read_token() if url else ""
        captured = await archive_from_harness(
            store,
            session,
            url,
            token,
            cause=cause,
            transport=transport,
            max_history_bytes=max_history_bytes,
        )
    except (OSError, LookupError, WireFault, KubeError, httpx.HTTPError, ValueError) as err:
        why = f"{type(err).__name__}: {err}"
        finished = parse_time(status.get("finishedAt")) or datetime.now(UTC)
        waited = (datetime.now(UTC) - finished).total_seconds()
        if ip and waited < deadline_seconds:
            log.warning("archive of %s failed (%s); retrying", pod_path, why)
            return Release(release=False, retry_after=ARCHIVE_RETRY)
        text = f"the transcript could not be archived, the pod goes anyway: {why}"
        return Release(
            release=True,
            status=_with_condition(status, False, R.ARCHIVE_FAILED, text, generation),
            event=PlannedEvent("Warning", R.ARCHIVE_FAILED, text),
        )
    if captured.omitted is not None:
        # Not retried: the history only grows. The record and the final status are kept.
        text = f"the final status is archived without the transcript ({cause}): {captured.omitted}"
        return Release(
            release=True,
            status=_with_condition(status, False, R.HISTORY_TOO_LARGE, text, generation),
            event=PlannedEvent("Warning", R.HISTORY_TOO_LARGE, text),
        )
    text = f"{captured.events} wire events and the final status archived ({cause})"
    return Release(
        release=True,
        status=_with_condition(status, True, R.ARCHIVED, text, generation),
        event=PlannedEvent("Normal", R.ARCHIVED, text),
    )
