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

from corral_api.kinds import SessionStatus, Usage
from corral_api.wire import CustodianDelivery, CustodianUsage

from ..custodianclient import CustodianUnavailable, status_usage
from ..driver import DriverState, hold_for_children
from ..egressrecords import with_egress
from ..kube import Kube, corral_path
from ..planning.delivery import DeliveryVerdict, judge_delivery, with_delivered
from ..planning.patch import merge_patch
from ..planning.reasons import BUDGET_EXCEEDED, DELIVERY_FAILED
from ..planning.session import EventType, PlannedEvent, SandboxState, now_text
from ..planning.turns import driver_state_from_status, status_with_driver_state
from .view import SessionView

log = logging.getLogger("corral.operator.store")

UsageReader = Callable[[], Awaitable[CustodianUsage]]
DeliveryReader = Callable[[], Awaitable[CustodianDelivery]]
ChildrenReader = Callable[[], Awaitable[list[dict[str, Any]]]]


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
        self,
        kube: Kube,
        namespace: str,
        name: str,
        usage_reader: UsageReader | None = None,
        delivery_reader: DeliveryReader | None = None,
        children_reader: ChildrenReader | None = None,
        *,
        on_phase: Callable[[PlannedEvent], None] | None = None,
        view: SessionView | None = None,
        planned: dict[str, Any] | None = None,
        sandbox_at_end: SandboxState = "kept",
        egress: Callable[[], dict[str, Any] | None] | None = None,
    ) -> None:
        self._kube = kube
        # The egress gateway's latest summary of this Session (docs/egress.md), for each write.
        self._egress = egress
        # The sandbox as the session's last write says it (turns.status_with_driver_state):
        # "released" saves the write the next pass would make before deleting the pod.
        self._at_end: SandboxState = sandbox_at_end
        # Told of each phase change this store writes, once, after the write (an Event).
        self._on_phase = on_phase
        self._path = corral_path("Session", namespace, name)
        # Reads and writes through the Session's loop's view, when it has one (no GET when
        # the loop's last write is still the newest).
        self._view = view if view is not None else SessionView(kube, self._path)
        self._status: dict[str, Any] = {}
        # The status on the server, and the one the Session's pass planned but left to this
        # store's first write (None once written): the driver starts from the planned one.
        self._written: dict[str, Any] = {}
        self._planned = planned
        self._generation = 0
        self._usage_reader = usage_reader
        self._settled: tuple[str, str] | None = None
        self._read_finished = False
        self._delivery_reader = delivery_reader
        self._children_reader = children_reader
        self._delivery_read_for: str | None = None  # the submission whose delivery was read

    async def load(self) -> DriverState:
        body = await self._view.read()
        if body is None:
            raise LookupError(f"Session {self._path} is gone")
        self._written = dict(body.get("status") or {})
        self._status = dict(self._planned) if self._planned is not None else self._written
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

    async def _delivery(self, state: DriverState) -> DeliveryVerdict | None:
        """The verdict on the custodian's delivery for the turn that just settled (read once
        per settlement; the harness delivered before the settlement was published)."""
        last = state.last_settlement
        if self._delivery_reader is None or last is None:
            return None
        if last.submission_id == self._delivery_read_for:
            return None
        try:
            record = (await self._delivery_reader()).delivery
        except CustodianUnavailable as err:
            log.warning("%s: the custodian's delivery is not readable: %s", self._path, err)
            return None
        self._delivery_read_for = last.submission_id
        return None if record is None else judge_delivery(record, last.submission_id, state.phase)

    async def _wait_for_children(self, state: DriverState) -> None:
        """A session about to succeed while children it started still run waits for them
        instead (docs/children.md), by the wait it last asked for, else all of them."""
        if self._children_reader is None or state.phase != "Succeeded":
            return
        hold_for_children(state, await self._children_reader())

    async def save(self, state: DriverState) -> None:
        await self._wait_for_children(state)
        verdict = await self._delivery(state)
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
        elif verdict is not None and verdict.fails_session is not None:
            state.phase = "Failed"
            state.message = verdict.fails_session
            reason = DELIVERY_FAILED
        new = status_with_driver_state(
            self._status,
            state,
            "ready",
            now=now_text(datetime.now(UTC)),
            generation=self._generation,
            usage=usage,
            reason=reason,
            at_end=self._at_end,
        )
        if verdict is not None:
            new = _with_delivery(new, verdict, self._generation)
        if self._egress is not None:
            new = with_egress(new, self._egress())
        patch = merge_patch(self._written, new)
        self._planned = None
        if patch:
            before = self._written.get("phase") or "Pending"
            patched = await self._view.patch_status(patch)
            self._status = self._written = dict(patched.get("status") or new)
            after = self._status.get("phase") or "Pending"
            if after != before and self._on_phase is not None:
                self._on_phase(phase_event(before, after, self._status.get("message")))
        if spent is not None and was_running:
            raise BudgetExceededStop(spent)

    async def write_planned(self) -> None:
        """Write the planned status if no save did (the driver stopped before writing)."""
        if self._planned is None:
            return
        if not self._written:
            body = await self._view.read()
            self._written = dict((body or {}).get("status") or {})
        patch = merge_patch(self._written, self._planned)
        self._planned = None
        if patch:
            self._status = self._written = dict(
                (await self._view.patch_status(patch)).get("status") or {}
            )


def phase_event(before: str, after: str, message: str | None) -> PlannedEvent:
    """The Event of a phase change: reason `Phase<after>`, as the Session planner names its own
    (docs/observability.md); a Warning when the session failed."""
    text = f"{before} -> {after}" + (f": {message}" if message else "")
    kind: EventType = "Warning" if after == "Failed" else "Normal"
    return PlannedEvent(kind, f"Phase{after}", text[:1000])


def _with_delivery(
    status: dict[str, Any], verdict: DeliveryVerdict, generation: int
) -> dict[str, Any]:
    """`status` with `delivery` and the `Delivered` condition from the custodian's record."""
    parsed = SessionStatus.model_validate(status)
    conditions = with_delivered(
        parsed.conditions, verdict, now=now_text(datetime.now(UTC)), generation=generation
    )
    return parsed.model_copy(update={"delivery": verdict.delivery, "conditions": conditions}).wire()
