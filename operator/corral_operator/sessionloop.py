"""One Session's life in the operator: observe, plan, apply; drive turns while the harness serves.

Runs as a kopf daemon per Session, so an operator that restarts starts it again for every
Session and the driver re-attaches from the ledger in status.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from corral_api.freeze import FREEZE_CAUSE, FrozenBy, covering_freeze
from corral_api.kinds import (
    MAX_DEPTH_CAP,
    AdmissionLedger,
    Agent,
    AgentSpec,
    Session,
    SessionStatus,
)
from corral_api.wire import (
    AdmitRequest,
    AdmitResponse,
    CustodianDelivery,
    CustodianUsage,
    EndResponse,
    SettledEvent,
)
from corral_common import logs

from . import naming
from .archive.release import archive_before_release, archived_already
from .custodianclient import read_delivery, read_usage
from .driver import (
    AdmissionRejected,
    CheckResult,
    EventSink,
    SessionDriver,
    WireFault,
    children_report,
)
from .handlers import pool
from .kube import Kube, KubeError, corral_path, object_path
from .planning.agent import agent_ready
from .planning.children import may_have_children
from .planning.lineage import Lineage, with_turn_cap
from .planning.patch import merge_patch
from .planning.session import (
    PlannedEvent,
    SessionPlan,
    now_text,
    ownership,
    plan_session,
    with_sandbox_refused,
)
from .planning.turns import event_for
from .podbuilder import WIRE_TOKEN_KEY, build_sandbox
from .runtime import Runtime, WatchedObjects, post_event
from .sessionview import SessionView
from .store import BudgetExceededStop, SessionStatusStore
from .wireclient import WireClient

log = logging.getLogger("corral.operator.session")

IDLE_RECHECK = 30.0
DRIVER_RECHECK = 30.0
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# The custodian labels each child Session with its parent's uid (never trusted for depth).
PARENT_UID_LABEL = "corral.dev/parent-uid"
RETRY_AFTER_ERROR = 1.0
RETRY_CAP = 30.0


async def read_wire_token(
    kube: Kube,
    namespace: str,
    session: str,
    uid: str,
    written: dict[tuple[str, str], tuple[str, str]] | None = None,
) -> str:
    """The Session's wire token: the one this process wrote into its Secret (`written`), else
    read from its own Secret only: one it does not control is refused."""
    kept_uid, token = (written or {}).get((namespace, session), ("", ""))
    if token and kept_uid == uid:
        return token
    path = object_path("v1", "Secret", namespace, naming.wire_secret_name(session))
    secret = await kube.get(path)
    if secret is None:
        raise KubeError(404, f"wire token secret {path} is missing")
    if ownership(secret, session, uid) != "ours":
        raise KubeError(409, f"the Secret {path} is not owned by this Session; it is not used")
    return base64.b64decode(secret["data"][WIRE_TOKEN_KEY]).decode()


class FreshAgentWire:
    """The wire as the driver sees it, with the Agent's spec read afresh at every admission.

    A changed Agent (tools, instructions, model) reaches a running Session on its next
    submission, as DESIGN §2 asks; a deleted or invalid Agent leaves the last valid spec. The
    turn limit the operator derived from the parent chain stays on it.
    """

    def __init__(
        self,
        inner: WireClient,
        read_agent: Callable[[], Awaitable[dict[str, Any] | None]],
        max_turns: int,
        timed: Callable[[float], None] | None = None,
    ) -> None:
        self._inner = inner
        self._read_agent = read_agent  # the watched Agent, else the API server's
        self._max_turns = max_turns
        self._timed = timed  # told how long each admission call took

    async def admit(self, conversation: str, request: AdmitRequest) -> AdmitResponse:
        body = await self._read_agent()
        if body is not None and agent_ready(body):
            with contextlib.suppress(ValidationError):
                fresh = AgentSpec.model_validate(body.get("spec") or {})
                request = request.model_copy(
                    update={"agent": with_turn_cap(fresh, self._max_turns)}
                )
        started = time.perf_counter()
        admitted = await self._inner.admit(conversation, request)
        if self._timed is not None:
            self._timed(time.perf_counter() - started)
        return admitted

    async def wait(
        self, conversation: str, ledger: AdmissionLedger, on_event: EventSink | None = None
    ) -> SettledEvent:
        return await self._inner.wait(conversation, ledger, on_event)

    async def abort(
        self, conversation: str, *, cause: str | None = None, submission_id: str | None = None
    ) -> bool:
        return await self._inner.abort(conversation, cause=cause, submission_id=submission_id)

    async def end(
        self, conversation: str, *, agent: AgentSpec | None = None, phase: str | None = None
    ) -> EndResponse:
        # The sessionEnd hooks of the Agent as it is now, like every admission's.
        body = await self._read_agent()
        if body is not None and agent_ready(body):
            with contextlib.suppress(ValidationError):
                agent = AgentSpec.model_validate(body.get("spec") or {})
        return await self._inner.end(conversation, agent=agent, phase=phase)

    async def checks(self, command: str, timeout_seconds: int | None = None) -> CheckResult:
        return await self._inner.checks(command, timeout_seconds)


def resumed_run_id(conversation: str, status: SessionStatus) -> str | None:
    """The run id of the turn in the ledger, as the driver minted it when it admitted it."""
    if status.ledger is None:
        return None
    attempt = f"-f{status.freeze_interruptions}" if status.freeze_interruptions else ""
    return f"{conversation}.{status.ledger.turn}{attempt}"


def sandbox_pod_path(body: dict[str, Any]) -> str:
    """The Session's pod: the one its status names (an adopted warm pod has its own name),
    else the name a cold pod gets. Either is used only while this Session controls it."""
    md = body["metadata"]
    name = (body.get("status") or {}).get("podName") or naming.pod_name(md["name"])
    return object_path("v1", "Pod", md["namespace"], str(name))


class StopFlag(Protocol):
    """kopf's DaemonStopped: truthy once the daemon should stop."""

    def __bool__(self) -> bool: ...


class SessionLoop:
    def __init__(
        self,
        runtime: Runtime,
        namespace: str,
        name: str,
        live: Mapping[str, Any] | None = None,
    ) -> None:
        self._rt = runtime
        self._kube: Kube = runtime.kube
        self._ns = namespace
        self._name = name
        self._path = corral_path("Session", namespace, name)
        # The Session as kopf's watch (`live`) and this loop's own reads and writes know it.
        self._view = SessionView(self._kube, self._path, live)
        # Set when a create met an object in the way: the next pass looks the objects up.
        self._look_up_existing = False
        self._pod_path = object_path("v1", "Pod", namespace, naming.pod_name(name))
        self._wake = runtime.wakeup(namespace, name)
        # The Session and its ancestors as the last pass read them, for the freeze check.
        self._chain: list[dict[str, Any]] = []
        # Set by a pass whose pod waits for a failing archive: when to try again.
        self._archive_retry: float | None = None

    async def run(self, stopped: StopFlag) -> None:
        failures = 0
        # kopf's flag is awaitable; bridge it to our wake-up so no sleep outlasts a stop.
        waiter = getattr(stopped, "wait", None)
        bridge = asyncio.ensure_future(self._wake_on(waiter())) if waiter else None
        # Every line this daemon's task logs names its Session (docs/observability.md).
        logs.bind(session=f"{self._ns}/{self._name}")
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

    async def last_known(self) -> dict[str, Any] | None:
        """The Session as this loop knows it now (after it stopped: for the abort on deletion);
        None when it cannot be read."""
        try:
            return await self._view.read()
        except KubeError as err:
            log.warning("session %s/%s: not readable: %s", self._ns, self._name, err)
            return None

    async def _wake_on(self, flag: Any) -> None:
        await flag
        self._wake.set()

    async def _sleep(self, seconds: float, stopped: StopFlag) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    # ---------------------------------------------------------------------------- one pass

    async def _step(self, stopped: StopFlag) -> float | None:
        """One observe-plan-apply pass; the seconds to wait before the next, None to stop."""
        started = time.perf_counter()
        body = await self._view.read()
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        agent_ref = (body.get("spec") or {}).get("agentRef", "")
        # The Agent and the pod as the operator's watches delivered them, else from the server;
        # reads that do not depend on each other go out together (under load each is a wait).
        self._pod_path = sandbox_pod_path(body)
        pod_name = self._pod_path.rpartition("/")[2]
        # A Session not yet planned has no pod unless the watch saw one: a pod in the way
        # shows as a 409 when it is created, and that pass looks everything up.
        unplanned = not (body.get("status") or {}).get("conditions") and not self._look_up_existing
        agent, pod = await asyncio.gather(
            self._read_through(
                self._rt.agents, agent_ref, corral_path("Agent", self._ns, agent_ref)
            ),
            self._read_through(self._rt.pods, pod_name, self._pod_path, ask=not unplanned),
        )
        uid = body["metadata"].get("uid", "")
        children = None
        if may_have_children(body, agent):
            children = await self._kube.list(
                corral_path("Session", self._ns), label_selector=f"{PARENT_UID_LABEL}={uid}"
            )
        status = body.get("status") or {}
        approvals = None
        if status.get("phase") == "WaitingForHuman":
            approvals = await self._kube.list(corral_path("Approval", self._ns))
        final = status.get("phase") in ("Succeeded", "Failed", "Stopped")
        parents: list[dict[str, Any]] = []
        ancestor_agents: dict[str, dict[str, Any] | None] = {}
        existing: dict[str, dict[str, Any]] = {}
        frozen_by: FrozenBy | None = None
        if not final:
            parents, ancestor_agents = await self._ancestors(body)
            self._chain = [body, *parents]
            if pod is None and not unplanned:
                # A Session past its first pass may have left objects behind (a restart, an
                # earlier Session of this name); a new one creates, and looks only on a 409.
                existing, frozen_by = await asyncio.gather(self._existing(), self._frozen_by())
            else:
                frozen_by = await self._frozen_by()
        plan = plan_session(
            body,
            agent,
            pod,
            self._rt.settings,
            datetime.now(UTC),
            children,
            approvals,
            parents=parents,
            ancestor_agents=ancestor_agents,
            existing=existing,
            frozen_by=frozen_by,
        )
        self._archive_retry = None
        # A pass about to drive leaves its status to the driver's first write (the admission
        # ledger follows within milliseconds): one write per turn started, not two.
        driving = plan.drive and agent is not None and plan.harness_url is not None
        adopted = await self._apply(body, agent, plan, defer_status=driving)
        self._rt.metrics.reconcile_seconds.labels("Session").observe(time.perf_counter() - started)
        if self._archive_retry is not None:
            return self._archive_retry
        if plan.delete_session:
            return None
        if adopted:
            return 0.0  # a warm pod is ready now: drive the first turn without waiting
        if driving:
            assert agent is not None and plan.lineage is not None and plan.pod_ip is not None
            await self._drive(body, agent, plan, stopped, children)
            return 0.0
        if plan.requeue_after is not None:
            return plan.requeue_after
        final = plan.status.get("phase") in ("Succeeded", "Failed", "Stopped")
        if final and not plan.delete_pod:
            return None  # nothing left to do until the Session changes (kopf restarts us)
        return IDLE_RECHECK

    async def _read_through(
        self, seen: WatchedObjects, name: str, path: str, *, ask: bool = True
    ) -> dict[str, Any] | None:
        """The object as recently watched, else (unless not `ask`ed to) read from the server
        and remembered: an Agent that does not change is then read once per
        WATCHED_FRESH_SECONDS, not once per pass of each of its Sessions."""
        found = seen.get(self._ns, name)
        if found is None and ask:
            seen.saw(self._ns, name, await self._kube.get(path))
            found = seen.get(self._ns, name)  # as kept: the same shape either way
        return found

    async def _ancestors(
        self, body: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any] | None]]:
        """The Sessions up the parentRef chain, nearest first, as far as they are found (one
        beyond the depth cap, so a chain too deep is seen), and the Agents they name."""
        parents: list[dict[str, Any]] = []
        seen = {body["metadata"].get("uid")}
        ref = (body.get("spec") or {}).get("parentRef") or {}
        while ref.get("name") and len(parents) <= MAX_DEPTH_CAP:
            name = str(ref["name"])
            if not _OBJECT_NAME.match(name):
                break
            parent = await self._kube.get(corral_path("Session", self._ns, name))
            if parent is None:
                break
            parents.append(parent)
            if parent["metadata"].get("uid") in seen:
                break
            seen.add(parent["metadata"].get("uid"))
            ref = (parent.get("spec") or {}).get("parentRef") or {}
        agents: dict[str, dict[str, Any] | None] = {}
        for parent in parents:
            name = str((parent.get("spec") or {}).get("agentRef") or "")
            if name and name not in agents and _OBJECT_NAME.match(name):
                agents[name] = await self._kube.get(corral_path("Agent", self._ns, name))
        return parents, agents

    async def _frozen_by(self) -> FrozenBy | None:
        """The Freeze that holds this Session now, from the namespace's Freeze cache (its first
        read lists them from the API server, so a freeze is not missed at start-up)."""
        freezes = await self._rt.freezes.freezes(self._kube, self._ns)
        return covering_freeze(self._chain, freezes)

    async def _existing(self) -> dict[str, dict[str, Any]]:
        """The objects already there under the names the sandbox's Secret and policy need."""
        wanted = (
            ("Secret", "v1", naming.wire_secret_name(self._name)),
            ("NetworkPolicy", "networking.k8s.io/v1", naming.network_policy_name(self._name)),
        )
        objs = await asyncio.gather(
            *(self._kube.get(object_path(api, kind, self._ns, name)) for kind, api, name in wanted)
        )
        return {
            kind: obj for (kind, _, _), obj in zip(wanted, objs, strict=True) if obj is not None
        }

    async def _apply(
        self,
        body: dict[str, Any],
        agent: dict[str, Any] | None,
        plan: SessionPlan,
        *,
        defer_status: bool = False,
    ) -> bool:
        """Apply the plan; True when it adopted a warm pod. With `defer_status`, the planned
        status is not written here: the driver's store writes it with its first save."""
        status = plan.status
        refused: KubeError | None = None
        adopted: str | None = None
        if plan.create_sandbox and agent is not None and plan.lineage is not None:
            try:
                adopted = await self._create_sandbox(body, agent, plan.lineage)
                if adopted is not None:
                    status = {**status, "podName": adopted}
                    text = f"adopted the warm pod {adopted}"
                    post_event(body, PlannedEvent("Normal", "SandboxAdopted", text))
            except KubeError as err:
                refused = err
                generation = int(body["metadata"].get("generation") or 0)
                status = with_sandbox_refused(
                    status, err.reason, now=datetime.now(UTC), generation=generation
                )
        patch = merge_patch(body.get("status") or {}, status)
        if patch and not defer_status:
            await self._view.patch_status(patch)
        for event in plan.events:
            post_event(body, event)
        if refused is not None:
            post_event(body, PlannedEvent("Warning", "SandboxRefused", refused.reason))
            raise refused
        if (plan.delete_pod or plan.delete_session) and not await self._archive(
            body, status, "ttl" if plan.delete_session else "finished"
        ):
            return adopted is not None  # the pod waits for its archive; retried shortly
        if plan.delete_pod and await self._kube.delete(self._pod_path):
            post_event(
                body, PlannedEvent("Normal", "SandboxReleased", "the sandbox pod is deleted")
            )
        if plan.delete_session:
            await self._kube.delete(self._path)
        return adopted is not None

    async def _archive(self, body: dict[str, Any], status: dict[str, Any], cause: str) -> bool:
        """Archive the Session before its pod (or itself) goes (docs/history.md); False while
        the pod should wait for a retry, True once it may go (archived, off, or given up)."""
        store = self._rt.archive
        if store is None or archived_already(status):
            return True
        md = body["metadata"]
        done = await archive_before_release(
            self._kube,
            store,
            body,
            status,
            self._pod_path,
            lambda: read_wire_token(
                self._kube, self._ns, self._name, str(md.get("uid", "")), self._rt.wire_tokens
            ),
            harness_port=self._rt.settings.harness_port,
            deadline_seconds=self._rt.settings.archive_deadline_seconds,
            cause=cause,
            transport=self._rt.wire_transport,
            max_history_bytes=self._rt.settings.max_history_bytes,
        )
        self._archive_retry = done.retry_after
        if done.status is not None:
            await self._view.patch_status(done.status)
        if done.event is not None:
            post_event(body, done.event)
        return done.release

    async def _create_sandbox(
        self, body: dict[str, Any], agent: dict[str, Any], lineage: Lineage
    ) -> str | None:
        """Create the Secret and the policy (together), then the pod. An object that exists
        already is used only if this Session controls it; otherwise the pod is not created (a
        pod must never mount a Secret someone else wrote, nor run before its policy) and the
        next pass fails the Session naming the object. Once the Secret and the policy are
        there, a pod of the Agent's warm pool is adopted instead of creating one when there is
        one: its name."""
        session = Session.model_validate({k: body[k] for k in ("metadata", "spec")})
        the_agent = Agent.model_validate({k: agent[k] for k in ("metadata", "spec")})
        wire_token, credential = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        manifests = build_sandbox(
            the_agent, session, self._rt.settings, wire_token, credential, budget=lineage.budget
        )
        uid = str(body["metadata"].get("uid", ""))
        secret_created, _ = await asyncio.gather(
            self._create_ours(manifests.secret, uid),
            self._create_ours(manifests.network_policy, uid),
        )
        if secret_created:
            self._rt.wire_tokens[(self._ns, self._name)] = (uid, wire_token)
        adopted = await pool.adopt_pooled_pod(
            self._rt, the_agent, session, wire_token, credential, lineage.budget
        )
        if adopted is not None:
            self._rt.metrics.pods_started.labels(self._ns, "warm").inc()
            return adopted
        if await self._create_ours(manifests.pod, uid, remember=True):
            self._rt.metrics.pods_started.labels(self._ns, "cold").inc()
        return None

    async def _create_ours(
        self, manifest: dict[str, Any], uid: str, *, remember: bool = False
    ) -> bool:
        """Create `manifest`: True when created, False when this Session's own is there
        already (a restart); KubeError 409 when someone else's is in the way. A `remember`ed
        pod is kept as created, so its ADDED event changes nothing and wakes no pass (that
        pass had nothing to do, and read the Session back while the watch lagged)."""
        if remember:
            created = await self._kube.create_object(manifest)
            if created is not None:
                self._rt.pods.saw(self._ns, manifest["metadata"]["name"], created)
                return True
        elif await self._kube.create(manifest):
            return True
        md = manifest["metadata"]
        path = object_path(manifest["apiVersion"], manifest["kind"], md["namespace"], md["name"])
        there = await self._kube.get(path)
        if there is None or ownership(there, self._name, uid) != "ours":
            self._look_up_existing = True  # the next pass plans with what is in the way
            what = f"{manifest['kind']} {md['name']}"
            raise KubeError(409, f"{what} exists and is not this Session's")
        return False

    # ------------------------------------------------------------------------------ turns

    async def _drive(
        self,
        body: dict[str, Any],
        agent: dict[str, Any],
        plan: SessionPlan,
        stopped: StopFlag,
        children: list[dict[str, Any]] | None = None,
    ) -> None:
        assert plan.harness_url is not None and plan.lineage is not None
        session = Session.model_validate({k: body[k] for k in ("metadata", "spec")})
        max_turns = plan.lineage.max_turns
        spec = with_turn_cap(
            Agent.model_validate({k: agent[k] for k in ("metadata", "spec")}).spec, max_turns
        )
        uid = str(body["metadata"].get("uid", ""))
        token = await read_wire_token(self._kube, self._ns, self._name, uid, self._rt.wire_tokens)
        client = WireClient(
            plan.harness_url,
            session.spec.agent_ref,
            token=token,
            poll_wait=self._rt.settings.wire_wait_seconds,
            transport=self._rt.wire_transport,
            max_answer_bytes=self._rt.settings.max_history_bytes,
        )
        custodian = f"http://{plan.pod_ip}:{self._rt.settings.custodian_operator_port}"

        async def usage() -> CustodianUsage:
            return await read_usage(custodian, token, transport=self._rt.wire_transport)

        async def delivery() -> CustodianDelivery:
            return await read_delivery(custodian, token, transport=self._rt.wire_transport)

        async def own_children() -> list[dict[str, Any]]:
            return await self._kube.list(
                corral_path("Session", self._ns), label_selector=f"{PARENT_UID_LABEL}={uid}"
            )

        def on_phase(event: PlannedEvent) -> None:
            post_event(body, event)

        store = SessionStatusStore(
            self._kube,
            self._ns,
            self._name,
            usage,
            delivery,
            own_children if may_have_children(body, agent) else None,
            on_phase=on_phase,
            view=self._view,
            planned=plan.status,  # what this pass planned and left to the store's first save
            # The pass after the end deletes the pod at once unless the Session keeps it or
            # its history is archived first: the end's write already says it is released.
            sandbox_at_end=(
                "kept" if session.spec.keep_sandbox or self._rt.archive is not None else "released"
            ),
        )
        metrics = self._rt.metrics
        created = str(body["metadata"].get("creationTimestamp") or "")

        def on_event(event: dict[str, Any]) -> None:
            planned = event_for(event)
            if planned is not None:
                post_event(body, planned)
            metrics.driver_event(self._ns, session.spec.agent_ref, event, created)
            if event.get("source") == "driver" and event.get("type") == "settled":
                # In the driver's task: the line carries the run id (docs/observability.md).
                log.info("turn %s settled %s", event.get("turn"), event.get("status"))

        def timed(seconds: float) -> None:
            metrics.admission_seconds.labels(self._ns).observe(seconds)

        agent_ref = session.spec.agent_ref

        async def read_agent() -> dict[str, Any] | None:
            return await self._read_through(
                self._rt.agents, agent_ref, corral_path("Agent", self._ns, agent_ref)
            )

        wire = FreshAgentWire(client, read_agent, max_turns, timed)
        old = SessionStatus.model_validate(body.get("status") or {})
        report = None
        if old.phase == "WaitingForChildren":
            report = children_report(old.waiting_for, children or [], old.reported_children)
        driver = SessionDriver(
            wire, store, spec, session.spec, self._name, on_event, children_report=report
        )
        key = (self._ns, self._name)
        self._rt.drivers[key] = driver
        if plan.frozen_by is not None:  # re-attached only to stop the turn in flight
            await self._interrupt(body, driver, plan.frozen_by)
        # A re-attached turn's lines carry its run id from the start (the driver's own).
        with logs.bound(runId=resumed_run_id(self._name, old)):
            task = asyncio.create_task(driver.run(), name=f"driver {self._ns}/{self._name}")
        try:
            await self._watch_driver(task, driver, stopped, body)
        except AdmissionRejected as rejected:
            message = f"the harness refused the turn: {rejected.reason}"
            await self._fail(store, message)
            post_event(body, PlannedEvent("Warning", "AdmissionRejected", message))
        except BudgetExceededStop as spent:
            # The store saved the Session Failed (BudgetExceeded) before stopping the driver.
            post_event(body, PlannedEvent("Warning", "BudgetExceeded", str(spent)))
        finally:
            self._rt.drivers.pop(key, None)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await client.aclose()
            try:
                await store.write_planned()
            except (KubeError, LookupError) as err:  # the next pass plans and writes it again
                log.warning("session %s/%s: status not written: %s", self._ns, self._name, err)

    async def _interrupt(
        self, body: dict[str, Any], driver: SessionDriver, frozen_by: FrozenBy
    ) -> None:
        text = f"interrupting the turn: {frozen_by.describe()}"
        post_event(body, PlannedEvent("Warning", "Frozen", text))
        await driver.interrupt(FREEZE_CAUSE)

    async def _watch_driver(
        self,
        task: asyncio.Task[Any],
        driver: SessionDriver,
        stopped: StopFlag,
        body: dict[str, Any],
    ) -> None:
        """Wait for the driver; stop it when the daemon stops or the sandbox pod goes, and
        interrupt its turn when a Freeze comes to hold the Session."""
        while not task.done():
            self._wake.clear()
            waker = asyncio.create_task(self._wake.wait())
            # The wake-up also fires when the daemon is told to stop (see `run`), so this
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
            if self._wake.is_set() and not await self._pod_alive():
                log.warning("session %s/%s: sandbox pod went away", self._ns, self._name)
                return
            if self._wake.is_set() and not driver.interrupted:
                try:
                    frozen_by = await self._frozen_by()
                except KubeError as err:  # the custodian still refuses on its own
                    log.warning("session %s/%s: freezes unreadable: %s", self._ns, self._name, err)
                    continue
                if frozen_by is not None:
                    await self._interrupt(body, driver, frozen_by)
        task.result()

    async def _pod_alive(self) -> bool:
        pod = await self._read_through(
            self._rt.pods, self._pod_path.rpartition("/")[2], self._pod_path
        )
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
