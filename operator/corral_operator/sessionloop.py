"""One Session's life in the operator: observe, plan, apply; drive turns while the harness serves.

Runs as a kopf daemon per Session, so an operator that restarts starts it again for every
Session and the driver re-attaches from the ledger in status.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from corral_api.kinds import AdmissionLedger, Agent, AgentSpec, Session
from corral_api.wire import AdmitRequest, AdmitResponse, SettledEvent

from . import naming
from .driver import AdmissionRejected, CheckResult, EventSink, SessionDriver, WireFault
from .kube import Kube, KubeError, corral_path, object_path
from .planning.agent import agent_ready
from .planning.patch import merge_patch
from .planning.session import (
    PlannedEvent,
    SessionPlan,
    now_text,
    plan_session,
    with_sandbox_refused,
)
from .planning.turns import event_for
from .podbuilder import WIRE_TOKEN_KEY, build_sandbox
from .runtime import Runtime, post_event
from .store import SessionStatusStore
from .wireclient import WireClient

log = logging.getLogger("corral.operator.session")

IDLE_RECHECK = 30.0
# The custodian labels each child Session with its parent's uid (never trusted for depth).
PARENT_UID_LABEL = "corral.dev/parent-uid"
RETRY_AFTER_ERROR = 1.0
RETRY_CAP = 30.0


async def read_wire_token(kube: Kube, namespace: str, session: str) -> str:
    path = object_path("v1", "Secret", namespace, naming.wire_secret_name(session))
    secret = await kube.get(path)
    if secret is None:
        raise KubeError(404, f"wire token secret {path} is missing")
    return base64.b64decode(secret["data"][WIRE_TOKEN_KEY]).decode()


class FreshAgentWire:
    """The wire as the driver sees it, with the Agent's spec read afresh at every admission.

    A changed Agent (tools, instructions, model) reaches a running Session on its next
    submission, as DESIGN §2 asks; a deleted or invalid Agent leaves the last valid spec.
    """

    def __init__(self, inner: WireClient, kube: Kube, namespace: str, agent: str) -> None:
        self._inner = inner
        self._kube = kube
        self._path = corral_path("Agent", namespace, agent)

    async def admit(self, conversation: str, request: AdmitRequest) -> AdmitResponse:
        body = await self._kube.get(self._path)
        if body is not None and agent_ready(body):
            with contextlib.suppress(ValidationError):
                fresh = AgentSpec.model_validate(body.get("spec") or {})
                request = request.model_copy(update={"agent": fresh})
        return await self._inner.admit(conversation, request)

    async def wait(
        self, conversation: str, ledger: AdmissionLedger, on_event: EventSink | None = None
    ) -> SettledEvent:
        return await self._inner.wait(conversation, ledger, on_event)

    async def abort(
        self, conversation: str, *, cause: str | None = None, submission_id: str | None = None
    ) -> bool:
        return await self._inner.abort(conversation, cause=cause, submission_id=submission_id)

    async def checks(self, command: str, timeout_seconds: int | None = None) -> CheckResult:
        return await self._inner.checks(command, timeout_seconds)


class StopFlag(Protocol):
    """kopf's DaemonStopped: truthy once the daemon should stop."""

    def __bool__(self) -> bool: ...


class SessionLoop:
    def __init__(self, runtime: Runtime, namespace: str, name: str) -> None:
        self._rt = runtime
        self._kube: Kube = runtime.kube
        self._ns = namespace
        self._name = name
        self._path = corral_path("Session", namespace, name)
        self._pod_path = object_path("v1", "Pod", namespace, naming.pod_name(name))
        self._wake = runtime.wakeup(namespace, name)

    async def run(self, stopped: StopFlag) -> None:
        failures = 0
        # kopf's flag is awaitable; bridge it to our wake-up so no sleep outlasts a stop.
        waiter = getattr(stopped, "wait", None)
        bridge = asyncio.ensure_future(self._wake_on(waiter())) if waiter else None
        try:
            while not stopped:
                self._wake.clear()
                try:
                    again = await self._step(stopped)
                    failures = 0
                except (KubeError, WireFault, OSError) as err:
                    failures += 1
                    again = min(RETRY_AFTER_ERROR * 2 ** (failures - 1), RETRY_CAP)
                    log.warning(
                        "session %s/%s: %s; retrying in %.0fs", self._ns, self._name, err, again
                    )
                if again is None:
                    return
                await self._sleep(again, stopped)
        finally:
            if bridge is not None:
                bridge.cancel()
            self._rt.forget(self._ns, self._name)

    async def _wake_on(self, flag: Any) -> None:
        await flag
        self._wake.set()

    async def _sleep(self, seconds: float, stopped: StopFlag) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    # ---------------------------------------------------------------------------- one pass

    async def _step(self, stopped: StopFlag) -> float | None:
        """One observe-plan-apply pass; the seconds to wait before the next, None to stop."""
        body = await self._kube.get(self._path)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        agent_ref = (body.get("spec") or {}).get("agentRef", "")
        agent = await self._kube.get(corral_path("Agent", self._ns, agent_ref))
        pod = await self._kube.get(self._pod_path)
        uid = body["metadata"].get("uid", "")
        children = await self._kube.list(
            corral_path("Session", self._ns), label_selector=f"{PARENT_UID_LABEL}={uid}"
        )
        approvals = None
        if (body.get("status") or {}).get("phase") == "WaitingForHuman":
            approvals = await self._kube.list(corral_path("Approval", self._ns))
        plan = plan_session(
            body, agent, pod, self._rt.settings, datetime.now(UTC), children, approvals
        )
        await self._apply(body, agent, plan)
        if plan.delete_session:
            return None
        if plan.drive and agent is not None and plan.harness_url is not None:
            await self._drive(body, agent, plan.harness_url, stopped)
            return 0.0
        if plan.requeue_after is not None:
            return plan.requeue_after
        final = plan.status.get("phase") in ("Succeeded", "Failed", "Stopped")
        if final and not plan.delete_pod:
            return None  # nothing left to do until the Session changes (kopf restarts us)
        return IDLE_RECHECK

    async def _apply(
        self, body: dict[str, Any], agent: dict[str, Any] | None, plan: SessionPlan
    ) -> None:
        status = plan.status
        refused: KubeError | None = None
        if plan.create_sandbox and agent is not None:
            try:
                await self._create_sandbox(body, agent)
            except KubeError as err:
                refused = err
                generation = int(body["metadata"].get("generation") or 0)
                status = with_sandbox_refused(
                    status, err.reason, now=datetime.now(UTC), generation=generation
                )
        patch = merge_patch(body.get("status") or {}, status)
        if patch:
            await self._kube.patch_status(self._path, patch)
        for event in plan.events:
            post_event(body, event)
        if refused is not None:
            post_event(body, PlannedEvent("Warning", "SandboxRefused", refused.reason))
            raise refused
        if plan.delete_pod and await self._kube.delete(self._pod_path):
            post_event(
                body, PlannedEvent("Normal", "SandboxReleased", "the sandbox pod is deleted")
            )
        if plan.delete_session:
            await self._kube.delete(self._path)

    async def _create_sandbox(self, body: dict[str, Any], agent: dict[str, Any]) -> None:
        session = Session.model_validate({k: body[k] for k in ("metadata", "spec")})
        the_agent = Agent.model_validate({k: agent[k] for k in ("metadata", "spec")})
        token = secrets.token_urlsafe(32)
        manifests = build_sandbox(the_agent, session, self._rt.settings, token)
        for manifest in manifests.all():
            await self._kube.create(manifest)

    # ------------------------------------------------------------------------------ turns

    async def _drive(
        self, body: dict[str, Any], agent: dict[str, Any], url: str, stopped: StopFlag
    ) -> None:
        session = Session.model_validate({k: body[k] for k in ("metadata", "spec")})
        spec = Agent.model_validate({k: agent[k] for k in ("metadata", "spec")}).spec
        token = await read_wire_token(self._kube, self._ns, self._name)
        client = WireClient(
            url,
            session.spec.agent_ref,
            token=token,
            poll_wait=self._rt.settings.wire_wait_seconds,
            transport=self._rt.wire_transport,
        )
        store = SessionStatusStore(self._kube, self._ns, self._name)

        def on_event(event: dict[str, Any]) -> None:
            planned = event_for(event)
            if planned is not None:
                post_event(body, planned)

        wire = FreshAgentWire(client, self._kube, self._ns, session.spec.agent_ref)
        driver = SessionDriver(wire, store, spec, session.spec, self._name, on_event)
        key = (self._ns, self._name)
        self._rt.drivers[key] = driver
        task = asyncio.create_task(driver.run(), name=f"driver {self._ns}/{self._name}")
        try:
            await self._watch_driver(task, driver, stopped)
        except AdmissionRejected as rejected:
            message = f"the harness refused the turn: {rejected.reason}"
            await self._fail(store, message)
            post_event(body, PlannedEvent("Warning", "AdmissionRejected", message))
        finally:
            self._rt.drivers.pop(key, None)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await client.aclose()

    async def _watch_driver(
        self, task: asyncio.Task[Any], driver: SessionDriver, stopped: StopFlag
    ) -> None:
        """Wait for the driver; stop it when the daemon stops or the sandbox pod goes."""
        while not task.done():
            self._wake.clear()
            waker = asyncio.create_task(self._wake.wait())
            done, _ = await asyncio.wait({task, waker}, timeout=1.0)
            waker.cancel()
            if task in done:
                break
            if stopped:
                # Deletion (or operator shutdown): the delete handler aborts the turn; an
                # operator shutdown leaves it running, and the ledger lets the next one resume.
                return
            if self._wake.is_set() and not await self._pod_alive():
                log.warning("session %s/%s: sandbox pod went away", self._ns, self._name)
                return
        task.result()

    async def _pod_alive(self) -> bool:
        pod = await self._kube.get(self._pod_path)
        return pod is not None and not pod["metadata"].get("deletionTimestamp")

    async def _fail(self, store: SessionStatusStore, message: str) -> None:
        state = await store.load()
        state.phase = "Failed"
        state.message = message
        state.ledger = None
        state.finished_at = now_text(datetime.now(UTC))
        await store.save(state)


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
    pod = await runtime.kube.get(
        object_path("v1", "Pod", md["namespace"], naming.pod_name(md["name"]))
    )
    ip = (pod or {}).get("status", {}).get("podIP")
    if not ip:
        return False
    token = await read_wire_token(runtime.kube, md["namespace"], md["name"])
    agent_ref = body["spec"]["agentRef"]
    url = f"http://{ip}:{runtime.settings.harness_port}"
    async with WireClient(url, agent_ref, token=token, transport=runtime.wire_transport) as client:
        return await client.abort(md["name"], submission_id=ledger.get("submissionId"))
