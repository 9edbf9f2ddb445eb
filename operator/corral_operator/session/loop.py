"""One Session's life in the operator: observe, plan, apply; drive turns while the harness serves.

Runs as a kopf daemon per Session, so an operator that restarts starts it again for every
Session and the driver re-attaches from the ledger in status. Each pass gathers its inputs
(`observe`), asks the pure planner (`planning.session`), applies the plan (`sandbox`, the
status written only when it changed, `release`) and then drives turns (`drive`) or waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from corral_api.kinds import FINAL_PHASES
from corral_common import logs
from corral_kube import MERGE_PATCH, KubeError

from ..driver import WireFault, WireVersionUnsupported
from ..egressrecords import POLL_SECONDS, with_egress
from ..naming import ANNOTATION_DRAINED
from ..planning.patch import merge_patch
from ..planning.reasons import VERSION_SKEW
from ..planning.session import PlannedEvent, SessionPlan
from ..runtime import Runtime, post_event
from ..wireclient import WireClient
from .context import LoopContext, StopFlag, sandbox_pod_path
from .drive import drive
from .observe import Observed, observe
from .release import release
from .sandbox import start_sandbox
from .wiretoken import read_wire_token

log = logging.getLogger("corral.operator.session")

IDLE_RECHECK = 30.0
# After a Session ends, one look at the gateway's records past its next poll (docs/egress.md).
EGRESS_SETTLE_SECONDS = POLL_SECONDS * 1.2
RETRY_AFTER_ERROR = 1.0
RETRY_CAP = 30.0


@dataclass(frozen=True)
class Applied:
    """What applying a plan left for the pass to decide on: a warm pod adopted, and when to
    try the archive again while the pod waits for it."""

    adopted: bool = False
    archive_retry: float | None = None


class SessionLoop:
    def __init__(
        self,
        runtime: Runtime,
        namespace: str,
        name: str,
        live: Mapping[str, Any] | None = None,
    ) -> None:
        self.ctx = LoopContext(runtime, namespace, name, live)

    async def run(self, stopped: StopFlag) -> None:
        ctx = self.ctx
        failures = 0
        bridge = _bridge_stop(stopped, ctx.wake)
        # Every line this daemon's task logs names its Session (docs/observability.md).
        logs.bind(session=f"{ctx.namespace}/{ctx.name}")
        try:
            while not stopped:
                ctx.wake.clear()
                try:
                    again = await self._pass(stopped)
                    failures = 0
                except WireVersionUnsupported as skew:
                    again = await drain_skewed(ctx, skew)
                except (KubeError, WireFault, OSError) as err:
                    failures += 1
                    again = min(RETRY_AFTER_ERROR * 2 ** (failures - 1), RETRY_CAP)
                    log.warning(
                        "session %s/%s: %s; retrying in %.0fs", ctx.namespace, ctx.name, err, again
                    )
                if again is None:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ctx.wake.wait(), timeout=again)
        finally:
            if bridge is not None:
                bridge.cancel()
            ctx.rt.forget(ctx.namespace, ctx.name)
            ctx.rt.egress.forget(ctx.namespace, ctx.name)

    async def last_known(self) -> dict[str, Any] | None:
        """The Session as this loop knows it now (after it stopped: for the abort on deletion);
        None when it cannot be read."""
        try:
            return await self.ctx.view.read()
        except KubeError as err:
            log.warning("session %s/%s: not readable: %s", self.ctx.namespace, self.ctx.name, err)
            return None

    async def _pass(self, stopped: StopFlag) -> float | None:
        """One observe-plan-apply pass; the seconds to wait before the next, None to stop."""
        started = time.perf_counter()
        seen = await observe(self.ctx)
        if seen is None:
            return None
        self.ctx.rt.egress.watch(seen.body)
        plan = seen.plan(self.ctx.rt.settings, datetime.now(UTC))
        # A pass about to drive leaves its status to the driver's first write (the admission
        # ledger follows within milliseconds): one write per turn started, not two.
        driving = plan.drive and seen.agent is not None and plan.harness_url is not None
        applied = await self._apply(seen, plan, defer_status=driving)
        self.ctx.rt.metrics.reconcile_seconds.labels("Session").observe(
            time.perf_counter() - started
        )
        if applied.archive_retry is not None:
            return applied.archive_retry
        if plan.delete_session:
            return None
        if applied.adopted:
            return 0.0  # a warm pod is ready now: drive the first turn without waiting
        if driving:
            assert seen.agent is not None and plan.lineage is not None and plan.pod_ip is not None
            await drive(self.ctx, seen.body, seen.agent, plan, stopped, seen.children)
            return 0.0
        wait = _wait_after(plan)
        if wait is None and self.ctx.rt.settings.egress_gateway is not None:
            wait = _egress_settling(plan.status, datetime.now(UTC))
        return wait

    async def _apply(self, seen: Observed, plan: SessionPlan, *, defer_status: bool) -> Applied:
        """Apply the plan: the sandbox, the status (only if it changed; with `defer_status`
        the driver's store writes it with its first save), the Events, then the release."""
        body = seen.body
        sandbox = await start_sandbox(self.ctx, body, seen.agent, plan)
        egress = self.ctx.rt.egress.summary_for(self.ctx.namespace, self.ctx.name)
        patch = merge_patch(body.get("status") or {}, with_egress(sandbox.status, egress))
        if patch and not defer_status:
            await self.ctx.view.patch_status(patch)
        for event in plan.events:
            post_event(body, event)
        if sandbox.refused is not None:
            post_event(body, PlannedEvent("Warning", "SandboxRefused", sandbox.refused.message))
            raise sandbox.refused
        retry = await release(self.ctx, body, sandbox.status, plan)
        return Applied(adopted=sandbox.adopted is not None, archive_retry=retry)


# A pod whose harness cannot be driven and cannot be drained (no archive) is looked at again
# this often: an operator that speaks its version (a rollback) may take the Session over.
SKEWED_RECHECK = RETRY_CAP


async def drain_skewed(ctx: LoopContext, skew: WireVersionUnsupported) -> float:
    """The Session's harness speaks a wire version this operator cannot drive: nothing of it is
    read. With an archive the pod is drained (every settled turn is delivered and the log is
    archived as it grows), so the Session resumes in a new pod of this operator's image;
    without one it is held, and the Warning says why."""
    pod = await ctx.read_pod()
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return RETRY_AFTER_ERROR
    body = await ctx.view.read()
    if body is None:
        return RETRY_AFTER_ERROR
    if ctx.rt.archive is None:
        log.warning("session %s/%s: %s; held: no archive to resume a new pod from",
                    ctx.namespace, ctx.name, skew.problem)  # fmt: skip
        text = f"{skew.problem}; the Session is held (no archive configured to drain it)"
        post_event(body, PlannedEvent("Warning", "SandboxVersionSkew", text))
        return SKEWED_RECHECK
    log.warning("session %s/%s: %s; draining its pod", ctx.namespace, ctx.name, skew.problem)
    post_event(body, PlannedEvent("Warning", "SandboxVersionSkew", f"{skew.problem}; the pod is "
                                  "drained and the Session resumes in a new one"))  # fmt: skip
    annotation = {"metadata": {"annotations": {ANNOTATION_DRAINED: VERSION_SKEW}}}
    await ctx.kube.request("PATCH", ctx.pod_path, body=annotation, content_type=MERGE_PATCH)
    await ctx.kube.delete(ctx.pod_path)
    return RETRY_AFTER_ERROR


def _wait_after(plan: SessionPlan) -> float | None:
    """How long a pass that neither drove nor released waits; None: until the Session changes."""
    if plan.requeue_after is not None:
        return plan.requeue_after
    if plan.status.get("phase") in FINAL_PHASES and not plan.delete_pod:
        return None  # nothing left to do until the Session changes (kopf restarts us)
    return IDLE_RECHECK


def _egress_settling(status: Mapping[str, Any], now: datetime) -> float | None:
    """A Session that just ended looks once more after the gateway's next poll, so its
    status.egress holds what its last seconds did; None once that is past."""
    finished = status.get("finishedAt")
    if not finished:
        return None
    try:
        ended = datetime.fromisoformat(str(finished).replace("Z", "+00:00"))
    except ValueError:
        return None
    seen = str((status.get("egress") or {}).get("observedAt") or "")
    if seen and seen >= str(finished):
        return None
    since = (now - ended).total_seconds()
    return EGRESS_SETTLE_SECONDS if since < 2 * EGRESS_SETTLE_SECONDS else None


def _bridge_stop(stopped: StopFlag, wake: asyncio.Event) -> asyncio.Future[None] | None:
    """kopf's flag is awaitable: bridged to the loop's wake-up, so no sleep outlasts a stop."""
    waiter = getattr(stopped, "wait", None)
    if waiter is None:
        return None

    async def wake_on(flag: Any) -> None:
        await flag
        wake.set()

    return asyncio.ensure_future(wake_on(waiter()))


async def abort_turn(runtime: Runtime, body: dict[str, Any]) -> bool:
    """Before a Session goes: abort its turn in flight, through its driver or the ledger."""
    md = body["metadata"]
    key = (md["namespace"], md["name"])
    driver = runtime.drivers.get(key)
    if driver is not None:
        await driver.abort()
        return True
    ledger = (body.get("status") or {}).get("ledger")
    if not ledger:
        return False
    pod = await runtime.kube.get(sandbox_pod_path(body))
    ip = (pod or {}).get("status", {}).get("podIP")
    if not ip:
        return False
    token = await read_wire_token(runtime.kube, md["namespace"], md["name"], md.get("uid", ""))
    agent_ref = body["spec"]["agentRef"]
    url = f"http://{ip}:{runtime.settings.harness_port}"
    async with WireClient(
        url,
        agent_ref,
        token=token,
        transport=runtime.wire_transport,
        max_answer_bytes=runtime.settings.max_history_bytes,
    ) as client:
        return await client.abort(md["name"], submission_id=ledger.get("submissionId"))
