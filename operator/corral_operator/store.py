"""The driver's TurnStore over a Session's status: the admission ledger lives on the server.

Every `save` is a merge patch of the status subresource, written before the driver takes its
next step, so an operator restarted at any point re-attaches to the submission in the ledger.

Usage is the custodian's: after each settlement (and when the session finishes) the store reads
the custodian's own record and writes that, never what the harness reported. When the record
says the budget is spent, the session ends `Failed` with reason `BudgetExceeded`, and the store
stops the driver before it admits another turn.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from corral_api.kinds import Usage
from corral_api.wire import CustodianUsage

from .custodianclient import CustodianUnavailable, status_usage
from .driver import DriverState
from .kube import Kube, corral_path
from .planning.patch import merge_patch
from .planning.reasons import BUDGET_EXCEEDED
from .planning.session import now_text
from .planning.turns import driver_state_from_status, status_with_driver_state

log = logging.getLogger("corral.operator.store")

UsageReader = Callable[[], Awaitable[CustodianUsage]]


class BudgetExceededStop(Exception):
    """The custodian says the budget is spent: the Session is saved `Failed`; stop driving."""


def _settled_key(state: DriverState) -> tuple[str, str] | None:
    last = state.last_settlement
    return None if last is None else (last.submission_id, last.status)


def budget_verdict(state: DriverState, record: CustodianUsage | None) -> str | None:
    """The message the session ends with when the custodian's record says the budget is spent
    and the session has not already ended another way; None otherwise. Mutates nothing."""
    if record is None or not record.exceeded or state.phase in ("Succeeded", "Stopped"):
        return None
    why = record.reason or "the custodian refuses further model calls"
    return f"the budget is spent: {why}"


class SessionStatusStore:
    def __init__(
        self, kube: Kube, namespace: str, name: str, usage_reader: UsageReader | None = None
    ) -> None:
        self._kube = kube
        self._path = corral_path("Session", namespace, name)
        self._status: dict[str, Any] = {}
        self._generation = 0
        self._usage_reader = usage_reader
        self._settled: tuple[str, str] | None = None
        self._read_finished = False

    async def load(self) -> DriverState:
        body = await self._kube.get(self._path)
        if body is None:
            raise LookupError(f"Session {self._path} is gone")
        self._status = dict(body.get("status") or {})
        self._generation = int(body.get("metadata", {}).get("generation") or 0)
        state = driver_state_from_status(self._status)
        self._settled = _settled_key(state)
        return state

    async def _custodian_record(self, state: DriverState) -> CustodianUsage | None:
        """The custodian's record, read after a new settlement and once on finishing."""
        if self._usage_reader is None:
            return None
        settled = _settled_key(state)
        finishing = state.finished and not self._read_finished
        if settled == self._settled and not finishing:
            return None
        self._settled = settled
        try:
            record = await self._usage_reader()
        except CustodianUnavailable as err:
            log.warning("%s: the custodian's usage is not readable: %s", self._path, err)
            return None
        self._read_finished = state.finished
        return record

    async def save(self, state: DriverState) -> None:
        record = await self._custodian_record(state)
        usage: Usage | None = status_usage(record) if record is not None else None
        spent = budget_verdict(state, record)
        was_running = not state.finished
        reason: str | None = None
        if spent is not None:
            state.phase = "Failed"
            state.message = spent
            state.ledger = None
            state.finished_at = state.finished_at or now_text(datetime.now(UTC))
            reason = BUDGET_EXCEEDED
        new = status_with_driver_state(
            self._status,
            state,
            "ready",
            now=now_text(datetime.now(UTC)),
            generation=self._generation,
            usage=usage,
            reason=reason,
        )
        patch = merge_patch(self._status, new)
        if patch:
            patched = await self._kube.patch_status(self._path, patch)
            self._status = dict(patched.get("status") or new)
        if spent is not None and was_running:
            raise BudgetExceededStop(spent)
