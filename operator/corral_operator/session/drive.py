"""The drive step of a Session's pass: while its harness serves, a `SessionDriver` runs its
turns, keeping the admission ledger in the Session's status (`store`), until the driver ends,
the daemon stops or the sandbox pod goes; a Freeze that comes to hold the Session interrupts
the turn in flight."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from corral_api.freeze import FREEZE_CAUSE, FrozenBy
from corral_api.kinds import Agent, Disruption, Session, SessionStatus, SuspendMode
from corral_api.wire import CustodianDelivery, CustodianUsage
from corral_common import logs
from corral_kube import KubeError

from ..custodianclient import read_delivery, read_usage
from ..driver import (
    SUSPEND_CAUSE,
    AdmissionRejected,
    DriverState,
    SessionDriver,
    WireFault,
    admission_attempt,
    children_report,
)
from ..planning.agent import usable_spec
from ..planning.children import may_have_children
from ..planning.lineage import with_turn_cap
from ..planning.session import PlannedEvent, SessionPlan, now_text
from ..planning.turns import event_for
from ..runtime import post_event
from ..wireclient import WireClient
from .context import LoopContext, StopFlag
from .continuity import LogArchiver, Run, WipKeeper, restore, restore_wip
from .disruption import TurnBudget
from .sandbox import resume_point
from .store import BudgetExceededStop, SessionStatusStore
from .wire import FreshAgentWire
from .wiretoken import read_wire_token

log = logging.getLogger("corral.operator.session")

DRIVER_RECHECK = 30.0


def resumed_run_id(conversation: str, status: SessionStatus) -> str | None:
    """The run id of the turn in the ledger, as the driver minted it when it admitted it."""
    if status.ledger is None:
        return None
    attempt = admission_attempt(DriverState.model_validate(status.wire()))
    return f"{conversation}.{status.ledger.turn}{attempt}"


async def drive(
    ctx: LoopContext,
    body: dict[str, Any],
    agent: dict[str, Any],
    plan: SessionPlan,
    stopped: StopFlag,
    children: list[dict[str, Any]] | None = None,
) -> None:
    """Drive the Session's turns at the harness the plan names, until the driver stops."""
    assert plan.harness_url is not None and plan.lineage is not None
    session = Session.model_validate({k: body[k] for k in ("metadata", "spec")})
    uid = str(body["metadata"].get("uid", ""))
    token = await read_wire_token(ctx.kube, ctx.namespace, ctx.name, uid, ctx.rt.wire_tokens)
    settings = ctx.rt.settings
    client = WireClient(
        plan.harness_url,
        session.spec.agent_ref,
        token=token,
        poll_wait=settings.wire_wait_seconds,
        transport=ctx.rt.wire_transport,
        max_answer_bytes=settings.max_history_bytes,
    )
    old = SessionStatus.model_validate(body.get("status") or {})
    kept, planned, old = await _continuity(ctx, uid, client, plan, old)
    store = _status_store(ctx, body, agent, plan, session, token, planned)
    driver = _driver(ctx, body, agent, plan, session, client, store, old, children, kept)
    keeping = _keep_wip(kept, agent, driver)
    key = (ctx.namespace, ctx.name)
    ctx.rt.drivers[key] = driver
    if plan.frozen_by is not None:  # re-attached only to stop the turn in flight
        await interrupt(body, driver, plan.frozen_by)
    elif plan.suspend is not None:  # re-attached only to end the turn in flight
        await suspend(body, driver, plan.suspend)
    # A re-attached turn's lines carry its run id from the start (the driver's own).
    with logs.bound(runId=resumed_run_id(ctx.name, old)):
        task = asyncio.create_task(driver.run(), name=f"driver {ctx.namespace}/{ctx.name}")
    try:
        await watch_driver(ctx, task, driver, stopped, body)
    except AdmissionRejected as rejected:
        message = f"the harness refused the turn: {rejected.reason}"
        await _fail(store, message)
        post_event(body, PlannedEvent("Warning", "AdmissionRejected", message))
    except BudgetExceededStop as spent:
        # The store saved the Session Failed (BudgetExceeded) before stopping the driver.
        post_event(body, PlannedEvent("Warning", "BudgetExceeded", str(spent)))
    finally:
        if keeping is not None:
            keeping.cancel()
        ctx.rt.drivers.pop(key, None)
        await _wind_down(ctx, task, client, store)


@dataclass
class _Kept:
    """What the archive keeps of a Session as it goes: its log, its work in progress, and
    when the work in progress laid over this pod's checkout was saved (None: none was)."""

    archiver: LogArchiver | None = None
    wip: WipKeeper | None = None
    wip_saved_at: str | None = None


async def _continuity(
    ctx: LoopContext, uid: str, client: WireClient, plan: SessionPlan, old: SessionStatus
) -> tuple[_Kept, dict[str, Any], SessionStatus]:
    """The archive's keepers for this pass, and for the first pass at a resumed Session's new
    pod its conversation and work in progress restored there; the status to start from."""
    planned = plan.status
    store = ctx.rt.archive
    if store is None:
        return _Kept(), planned, old
    run = Run(ctx.namespace, ctx.name, uid)
    kept = _Kept(LogArchiver(store, run, client), WipKeeper(store, run, client))
    if not old.restores_conversation or ctx.restored_into == plan.pod_ip:
        return kept, planned, old
    lost = await restore(store, run, client, SessionStatus.model_validate(planned))
    ctx.restored_into = plan.pod_ip
    if lost is not None:
        # The driver starts from the planned status, and its first save writes it: the turn
        # the new harness cannot know goes in there, as lost.
        planned, old = lost.wire(), lost
    try:
        kept.wip_saved_at = await restore_wip(store, run, client)
    except (WireFault, OSError, ValueError, httpx.HTTPError) as err:
        log.warning("session %s/%s: work in progress not restored: %s",
                    ctx.namespace, ctx.name, err)  # fmt: skip
    return kept, planned, old


def _keep_wip(
    kept: _Kept, agent: dict[str, Any], driver: SessionDriver
) -> asyncio.Task[None] | None:
    """Save the work in progress of each turn in flight every wipIntervalSeconds (0: never)."""
    spec = usable_spec(agent)
    seconds = spec.workspace.wip_interval() if spec is not None else 0
    if kept.wip is None or seconds <= 0:
        return None
    return asyncio.create_task(kept.wip.keep(float(seconds), lambda: driver.in_flight))


def _status_store(
    ctx: LoopContext,
    body: dict[str, Any],
    agent: dict[str, Any],
    plan: SessionPlan,
    session: Session,
    token: str,
    planned: dict[str, Any],
) -> SessionStatusStore:
    """The driver's TurnStore over the Session's status (`planned`: what this pass planned
    and left to the store's first save), reading the custodian's records."""
    custodian = f"http://{plan.pod_ip}:{ctx.rt.settings.custodian_operator_port}"
    transport = ctx.rt.wire_transport
    uid = str(body["metadata"].get("uid", ""))

    async def usage() -> CustodianUsage:
        return await read_usage(custodian, token, transport=transport)

    async def delivery() -> CustodianDelivery:
        return await read_delivery(custodian, token, transport=transport)

    async def own_children() -> list[dict[str, Any]]:
        return await ctx.own_children(uid)

    def on_phase(event: PlannedEvent) -> None:
        post_event(body, event)

    return SessionStatusStore(
        ctx.kube,
        ctx.namespace,
        ctx.name,
        usage,
        delivery,
        own_children if may_have_children(body, agent) else None,
        on_phase=on_phase,
        view=ctx.view,
        planned=planned,
        # The pass after the end deletes the pod at once unless the Session keeps it or
        # its history is archived first: the end's write already says it is released.
        sandbox_at_end=(
            "kept" if session.spec.keep_sandbox or ctx.rt.archive is not None else "released"
        ),
        egress=lambda: ctx.rt.egress.summary_for(ctx.namespace, ctx.name),
    )


def _driver(
    ctx: LoopContext,
    body: dict[str, Any],
    agent: dict[str, Any],
    plan: SessionPlan,
    session: Session,
    client: WireClient,
    store: SessionStatusStore,
    old: SessionStatus,
    children: list[dict[str, Any]] | None,
    kept: _Kept | None = None,
) -> SessionDriver:
    """The turn driver over the wire (the Agent read afresh at every admission) and the store,
    told how a parent's children ended when it waits for them."""
    assert plan.lineage is not None
    max_turns = plan.lineage.max_turns
    spec = with_turn_cap(
        Agent.model_validate({k: agent[k] for k in ("metadata", "spec")}).spec, max_turns
    )
    agent_ref = session.spec.agent_ref
    metrics = ctx.rt.metrics

    def timed(seconds: float) -> None:
        metrics.admission_seconds.labels(ctx.namespace).observe(seconds)

    async def read_agent() -> dict[str, Any] | None:
        return await ctx.read_agent(agent_ref)

    wire = FreshAgentWire(client, read_agent, max_turns, timed)
    report = None
    if old.phase == "WaitingForChildren":
        report = children_report(old.waiting_for, children or [], old.reported_children)
    kept = kept or _Kept()
    on_event = _event_sink(ctx, body, agent_ref, spec.sandbox.disruption_policy(), kept)
    resume = resume_point(body)
    return SessionDriver(
        wire, store, spec, session.spec, ctx.name, on_event, children_report=report,
        resumed_from=resume.revision if resume is not None else None,
        resumed_wip=kept.wip_saved_at,
    )  # fmt: skip


def _event_sink(
    ctx: LoopContext,
    body: dict[str, Any],
    agent_ref: str,
    disruption: Disruption,
    kept: _Kept,
) -> Callable[[dict[str, Any]], None]:
    """What the driver's events become: Events on the Session, metrics, a line per turn, the
    conversation's log archived after each admission and settlement, and the sandbox pod's
    disruption budget held and lifted as the Agent's `disruption` policy says."""
    metrics = ctx.rt.metrics
    created = str(body["metadata"].get("creationTimestamp") or "")
    budget = TurnBudget(ctx, disruption)

    def on_event(event: dict[str, Any]) -> None:
        planned = event_for(event)
        if planned is not None:
            post_event(body, planned)
        metrics.driver_event(ctx.namespace, agent_ref, event, created)
        if event.get("source") != "driver":
            return
        if event.get("type") == "settled":
            # In the driver's task: the line carries the run id (docs/observability.md).
            log.info("turn %s settled %s", event.get("turn"), event.get("status"))
        if event.get("type") == "reattached":
            ctx.background(budget.follow(event))
            return
        if event.get("type") not in ("admitted", "settled"):
            return
        ctx.background(budget.follow(event))
        if kept.archiver is not None:
            ctx.background(_archive_log(ctx, kept.archiver))
        if kept.wip is not None and event.get("type") == "settled":
            ctx.background(_drop_wip(ctx, kept.wip))

    return on_event


async def _drop_wip(ctx: LoopContext, keeper: WipKeeper) -> None:
    """Best effort: a snapshot left behind is never laid over a later checkout (its base)."""
    try:
        await keeper.drop()
    except OSError as err:
        log.warning("session %s/%s: work in progress not dropped: %s", ctx.namespace, ctx.name, err)


async def _archive_log(ctx: LoopContext, archiver: LogArchiver) -> None:
    """Best effort: a catch-up that fails is made up by the next one."""
    try:
        await archiver.catch_up()
    except (WireFault, OSError, ValueError, httpx.HTTPError) as err:
        log.warning("session %s/%s: log not archived: %s", ctx.namespace, ctx.name, err)


async def _wind_down(
    ctx: LoopContext,
    task: asyncio.Task[Any],
    client: WireClient,
    store: SessionStatusStore,
) -> None:
    """The driver's task stopped, its client closed, and the planned status written if no
    save of the driver's did."""
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    await client.aclose()
    try:
        await store.write_planned()
    except (KubeError, LookupError) as err:  # the next pass plans and writes it again
        log.warning("session %s/%s: status not written: %s", ctx.namespace, ctx.name, err)


async def interrupt(body: dict[str, Any], driver: SessionDriver, frozen_by: FrozenBy) -> None:
    text = f"interrupting the turn: {frozen_by.describe()}"
    post_event(body, PlannedEvent("Warning", "Frozen", text))
    await driver.interrupt(FREEZE_CAUSE)


async def suspend(body: dict[str, Any], driver: SessionDriver, mode: SuspendMode) -> None:
    """spec.suspend while a turn is in flight: abort it (`now`) or let it finish (`afterTurn`);
    either way nothing is admitted after it, and the next pass parks the Session."""
    if driver.interrupted or driver.holding:
        return
    if mode == "now":
        post_event(body, PlannedEvent("Normal", "Suspending", "aborting the turn in flight"))
        await driver.interrupt(SUSPEND_CAUSE)
    else:
        text = "the turn in flight finishes, then the Session is parked"
        post_event(body, PlannedEvent("Normal", "Suspending", text))
        driver.hold_after_turn()


async def watch_driver(
    ctx: LoopContext,
    task: asyncio.Task[Any],
    driver: SessionDriver,
    stopped: StopFlag,
    body: dict[str, Any],
) -> None:
    """Wait for the driver; stop it when the daemon stops or the sandbox pod goes, and
    interrupt its turn when a Freeze comes to hold the Session."""
    while not task.done():
        ctx.wake.clear()
        waker = asyncio.create_task(ctx.wake.wait())
        # The wake-up also fires when the daemon is told to stop (the loop's `run`), so this
        # timeout is only a safety net; a short one woke 1,000 idle loops every second.
        done, _ = await asyncio.wait(
            {task, waker}, timeout=DRIVER_RECHECK, return_when=asyncio.FIRST_COMPLETED
        )
        waker.cancel()
        if task in done:
            break
        if stopped:
            # Deletion (or operator shutdown): the delete handler aborts the turn; an
            # operator shutdown leaves it running, and the ledger lets the next one resume.
            return
        if ctx.wake.is_set() and not await _pod_alive(ctx):
            log.warning("session %s/%s: sandbox pod went away", ctx.namespace, ctx.name)
            return
        if ctx.wake.is_set() and not driver.interrupted:
            await _interrupt_if_frozen(ctx, driver, body)
        if ctx.wake.is_set() and not driver.interrupted:
            await _suspend_if_asked(ctx, driver, body)
    task.result()


async def _interrupt_if_frozen(
    ctx: LoopContext, driver: SessionDriver, body: dict[str, Any]
) -> None:
    try:
        frozen_by = await ctx.frozen_by()
    except KubeError as err:  # the custodian still refuses on its own
        log.warning("session %s/%s: freezes unreadable: %s", ctx.namespace, ctx.name, err)
        return
    if frozen_by is not None:
        await interrupt(body, driver, frozen_by)


async def _suspend_if_asked(ctx: LoopContext, driver: SessionDriver, body: dict[str, Any]) -> None:
    """The Session's spec as the watch has it now: a suspend asked for mid-turn."""
    try:
        now = await ctx.view.read()
    except KubeError as err:  # the next wake-up looks again
        log.warning("session %s/%s: not readable: %s", ctx.namespace, ctx.name, err)
        return
    spec = (now or {}).get("spec") or {}
    if spec.get("suspend"):
        await suspend(body, driver, "now" if spec.get("suspendMode") == "now" else "afterTurn")


async def _pod_alive(ctx: LoopContext) -> bool:
    pod = await ctx.read_pod()
    return pod is not None and not pod["metadata"].get("deletionTimestamp")


async def _fail(store: SessionStatusStore, message: str) -> None:
    state = await store.load()
    state.phase = "Failed"
    state.message = message
    state.ledger = None
    state.finished_at = now_text(datetime.now(UTC))
    await store.save(state)
