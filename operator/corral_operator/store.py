"""The driver's TurnStore over a Session's status: the admission ledger lives on the server.

Every `save` is a merge patch of the status subresource, written before the driver takes its
next step, so an operator restarted at any point re-attaches to the submission in the ledger.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from .driver import DriverState
from .kube import Kube, corral_path
from .planning.patch import merge_patch
from .planning.session import now_text
from .planning.turns import driver_state_from_status, status_with_driver_state


class SessionStatusStore:
    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self._kube = kube
        self._path = corral_path("Session", namespace, name)
        self._status: dict[str, Any] = {}
        self._generation = 0

    async def load(self) -> DriverState:
        body = await self._kube.get(self._path)
        if body is None:
            raise LookupError(f"Session {self._path} is gone")
        self._status = dict(body.get("status") or {})
        self._generation = int(body.get("metadata", {}).get("generation") or 0)
        return driver_state_from_status(self._status)

    async def save(self, state: DriverState) -> None:
        new = status_with_driver_state(
            self._status,
            state,
            "ready",
            now=now_text(datetime.now(UTC)),
            generation=self._generation,
        )
        patch = merge_patch(self._status, new)
        if not patch:
            return
        patched = await self._kube.patch_status(self._path, patch)
        self._status = dict(patched.get("status") or new)
