"""Goal: a daemon per Goal runs its waves (planning/goal.py decides; this applies).

Each pass reads the Goal, the Sessions it started and the namespace's Evidence for its check,
and creates what the planner asks for. Events on those Sessions and Evidence, and on the Goal
itself, wake the pass at once; everything lives in the API server, so a restarted operator
picks up where the last one stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from corral_api import GROUP, VERSION
from corral_api.labels import EVIDENCE_CHECK
from corral_kube import KubeError, KubeRefused

from .. import naming
from ..kube import corral_path
from ..planning.goal import GOAL_ANNOTATION, plan_goal
from ..planning.patch import merge_patch
from ..runtime import Runtime, post_event
from ._common import namespace_of, now, runtime

log = logging.getLogger("corral.operator.goal")

# A Goal that waits for its spec to be fixed sleeps until the Goal changes (or this long).
_IDLE = 300.0
_RETRY_CAP = 30.0


def _wake_key(goal: str) -> str:
    return f"goal:{goal}"


async def _one_pass(rt: Runtime, namespace: str, name: str) -> float | None:
    """Plan and apply once; seconds until the next pass, None when the Goal is settled."""
    path = corral_path("Goal", namespace, name)
    body = await rt.kube.get(path)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    sessions = await rt.kube.list(
        corral_path("Session", namespace),
        label_selector=f"{naming.LABEL_GOAL}={naming.label_value(name)}",
    )
    check = ((body.get("spec") or {}).get("success") or {}).get("name")
    evidences: list[dict[str, Any]] = []
    if isinstance(check, str) and check:
        with contextlib.suppress(KubeRefused):  # a check name no label can hold: planner says so
            evidences = await rt.kube.list(
                corral_path("Evidence", namespace), label_selector=f"{EVIDENCE_CHECK}={check}"
            )
    plan = plan_goal(body, sessions, evidences, now())
    for manifest in plan.create:
        await rt.kube.create(manifest)  # one that exists already (a restart) is left alone
    if plan.changed:
        await rt.kube.patch_status(path, merge_patch(body.get("status") or {}, plan.status))
    for event in plan.events:
        post_event(body, event)
    if plan.requeue_after is None:
        return None if plan.status.get("verdict") in ("Met", "Failed") else _IDLE
    return plan.requeue_after


@kopf.daemon(GROUP, VERSION, "goals", cancellation_timeout=5.0)
async def goal_daemon(
    name: str,
    namespace: str | None,
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    rt, namespace = runtime(memo), namespace_of(namespace)
    wake = rt.wakeup(namespace, _wake_key(name))
    failures = 0
    try:
        while not stopped:
            wake.clear()
            try:
                again = await _one_pass(rt, namespace, name)
                failures = 0
            except (KubeError, OSError) as err:
                failures += 1
                again = min(2.0**failures, _RETRY_CAP)
                log.warning("goal %s/%s: %s; retrying in %.0fs", namespace, name, err, again)
            if again is None:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=again)
    finally:
        rt.forget(namespace, _wake_key(name))


def _wake_goal(memo: kopf.Memo, namespace: str | None, goal: str | None) -> None:
    if goal and namespace:
        runtime(memo).wake(namespace, naming.label_value(_wake_key(goal)))


@kopf.on.event(GROUP, VERSION, "goals")
async def goal_changed(
    type: str | None, name: str, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    if type != "DELETED":
        _wake_goal(memo, namespace, name)


@kopf.on.event(GROUP, VERSION, "sessions", annotations={GOAL_ANNOTATION: kopf.PRESENT})
async def goal_session_changed(
    annotations: kopf.Annotations, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    _wake_goal(memo, namespace, annotations.get(GOAL_ANNOTATION))


@kopf.on.event(GROUP, VERSION, "evidences", annotations={GOAL_ANNOTATION: kopf.PRESENT})
async def goal_evidence_changed(
    annotations: kopf.Annotations, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    _wake_goal(memo, namespace, annotations.get(GOAL_ANNOTATION))
