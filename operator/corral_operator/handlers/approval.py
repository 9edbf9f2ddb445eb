"""Approval: announce it and check it names a real Session; never decide it.

The operator holds no right on approvals/status (ADR 0032): whoever may initialise that status
may also decide it. An Approval without status reads as Pending.
"""

from __future__ import annotations

from typing import Any

import kopf

from corral_api import GROUP, VERSION

from ..kube import corral_path
from ..planning.approval import check_approval
from ..runtime import post_event
from ._common import plain, runtime


@kopf.on.event(GROUP, VERSION, "approvals")
async def approval_created(**kw: Any) -> None:
    # A watch event, not kopf's on.create: that would patch kopf's annotations onto the
    # Approval, and the operator holds no write right on Approvals at all.
    if kw["type"] != "ADDED":
        return
    rt = runtime(kw["memo"])
    body = plain(kw["body"])
    ref = (body.get("spec") or {}).get("sessionRef") or {}
    session = await rt.kube.get(corral_path("Session", kw["namespace"], str(ref.get("name", ""))))
    post_event(body, check_approval(body, session))
