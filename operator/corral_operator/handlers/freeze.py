"""Freeze: wake every Session of its namespace so each looks at the freeze at once (a turn in
flight is interrupted, nothing new is admitted; lifted, the held ones continue), and keep the
Freeze's `Active` condition.

A watch event, not kopf's change handlers: those would put a finalizer on the Freeze, and a
freeze must be removable (and lifted: the custodian reads it live) with the operator down.
"""

from __future__ import annotations

from typing import Any

import kopf

from corral_api import GROUP, VERSION
from corral_kube import KubeError, NotFound

from ..kube import corral_path
from ..planning.freeze import plan_freeze
from ..planning.patch import merge_patch
from ..planning.session import PlannedEvent, now_text
from ..runtime import log, post_event
from ._common import namespace_of, now, plain, runtime


@kopf.on.event(GROUP, VERSION, "freezes")
async def freeze_event(
    type: str | None,
    body: kopf.Body,
    name: str,
    namespace: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    rt, namespace = runtime(memo), namespace_of(namespace)
    gone = type == "DELETED"
    freeze = plain(body)
    rt.freezes.saw(namespace, name, None if gone else freeze)
    rt.wake_namespace(namespace)
    if gone:
        return
    plan = plan_freeze(freeze, now_text(now()))
    if not plan.changed:
        return
    patch = merge_patch(freeze.get("status") or {}, plan.status)
    try:
        await rt.kube.patch_status(corral_path("Freeze", namespace, name), patch)
    except NotFound:  # deleted meanwhile: nothing to say
        return
    except KubeError as err:
        log.warning("freeze %s/%s: status not written: %s", namespace, name, err)
        return
    active = next(c for c in plan.status["conditions"] if c["type"] == "Active")
    if active["status"] == "True":
        post_event(freeze, PlannedEvent("Warning", active["reason"], active["message"]))
    else:
        post_event(freeze, PlannedEvent("Normal", active["reason"], active["message"]))
