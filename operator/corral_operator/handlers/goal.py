"""Goal: initialise its status so `kubectl get goals` reads Pending with zero waves.

Waves of Sessions are not run yet: a wave's success Evidence needs the revision the wave
pushed, and the Session's status does not carry it.
"""

from __future__ import annotations

from typing import Any

import kopf

from corral_api import GROUP, VERSION

from ..kube import corral_path
from ..planning.goal import plan_goal
from ..planning.patch import merge_patch
from ..planning.session import now_text
from ._common import now, plain, runtime


@kopf.on.event(GROUP, VERSION, "goals")
async def goal_changed(**kw: Any) -> None:
    if kw["type"] == "DELETED":
        return
    body = plain(kw["body"])
    status, changed = plan_goal(body, now_text(now()))
    if changed:
        patch = merge_patch(body.get("status") or {}, status)
        await runtime(kw["memo"]).kube.patch_status(
            corral_path("Goal", kw["namespace"], kw["name"]), patch
        )
