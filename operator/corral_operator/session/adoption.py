"""A Session adopts a pod of its Agent's warm pool (docs/warm-pool.md, ADR 0074).

The sandbox step calls `adopt_pooled_pod` once the Session's Secret and NetworkPolicy exist; it
claims a ready pod of the current Agent digest with a compare-and-swap relabel (the Session's
policy now selects it, the pool's no longer does), then hands the custodian and the harness
their Session through their adopt endpoints with the pod's one-time keys (spent by that adopt;
their Secret goes with the pod). Any failure deletes the pod and the Session tries the next,
then a cold pod. The pool itself is kept by its handlers (`handlers.pool`).

Behind the egress gateway (docs/egress.md) a pooled pod is unknown to the gateway (no binding:
nothing leaves it). The claim writes its Session's binding, with the git host open to the
agent's identity for the checkout the harness's adopt runs in the tools container; the adopts
go out only once every gateway replica knows that binding, and hand the custodian its
Session's proxy credential. Then the pod is bound again without the checkout's rule, and the
Session goes on only once every replica knows that too: no turn runs under the first binding.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import time
from typing import Any

import httpx

from corral_api.kinds import Agent, Budget, Session
from corral_api.wire import (
    AdoptedSession,
    CheckoutRequest,
    CustodianAdoptRequest,
    CustodianBudget,
    HarnessAdoptRequest,
)
from corral_kube import Conflict, KubeError, NotFound

from .. import naming
from ..budgets import lowest
from ..builders import egress
from ..builders.podbuilder import owner_reference, resolve_repo, sandbox_labels, session_binding
from ..builders.poolpod import CUSTODIAN_KEY, HARNESS_KEY, LABEL_POOL, agent_digest, key_secret_name
from ..egressrecords import await_binding
from ..kube import collection_path, object_path
from ..planning.pool import adoptable, claim_patch, warm_refusal
from ..runtime import Runtime
from ..settings import OperatorSettings

log = logging.getLogger("corral.operator.pool")

ADOPT_TIMEOUT = httpx.Timeout(300.0, connect=5.0)  # the harness's adopt includes the checkout
ADOPT_CONNECT_SECONDS = 15.0  # how long a refused connection to a just-claimed pod is retried
ADOPT_CONNECT_RETRY = 0.25


class AdoptRefused(Exception):
    """The pod answered an adopt with something other than success."""


async def adopt_pooled_pod(
    rt: Runtime,
    agent: Agent,
    session: Session,
    wire_token: str,
    custodian_credential: str,
    budget: Budget | None,
    egress_credential: str | None = None,
) -> str | None:
    """Adopt a pooled pod for `session`; its name, or None when the Session needs a cold pod.

    Call only once the Session's Secret and NetworkPolicy exist: the claim relabels the pod
    into that policy before it holds anything of the Session's. Behind the egress gateway,
    `egress_credential` is the one the Session's Secret holds.
    """
    if warm_refusal(agent, session) is not None:
        return None
    if rt.settings.egress_gateway is not None and egress_credential is None:
        return None  # nothing to hand the custodian: its requests could not leave
    md = session.metadata
    name, namespace = str(md["name"]), str(md["namespace"])
    agent_name = str(agent.metadata["name"])
    pods = await rt.kube.list(
        collection_path("v1", "Pod", namespace), f"{LABEL_POOL}={naming.label_value(agent_name)}"
    )
    started = time.monotonic()
    for pod in adoptable(pods, agent_digest(agent, rt.settings)):
        pod_name = str(pod["metadata"]["name"])
        binding = _Binding(rt, agent, session, pod, egress_credential)
        keys = await _claim(rt, pod, session, binding.annotations(checkout=True))
        if keys is None:
            continue
        claimed = time.monotonic()
        try:
            await binding.known(checkout=True)
            told = adopt_requests(
                rt.settings, agent, session, wire_token, custodian_credential, budget,
                egress_credential,
            )  # fmt: skip
            await _hand_over(rt, pod, keys, *told)
            await binding.rebind()
        except (KubeError, httpx.HTTPError, AdoptRefused) as err:
            # The pod spent its keys (or may have): it serves no one now. Its key Secret is
            # the pod's: the garbage collector removes it with the pod.
            log.warning("session %s/%s: adopting %s failed: %s", namespace, name, pod_name, err)
            await rt.kube.delete(object_path("v1", "Pod", namespace, pod_name))
            continue
        log.info(
            "session %s/%s: adopted %s in %.3f s (claim %.3f s)",
            namespace, name, pod_name, time.monotonic() - started, claimed - started,
        )  # fmt: skip
        return pod_name
    return None


class _Binding:
    """A pooled pod's binding at the egress gateway through its adoption (nothing without a
    gateway)."""

    def __init__(
        self,
        rt: Runtime,
        agent: Agent,
        session: Session,
        pod: dict[str, Any],
        credential: str | None,
    ) -> None:
        self._rt, self._agent, self._session, self._pod = rt, agent, session, pod
        self._credential = credential

    def annotations(self, *, checkout: bool) -> dict[str, str]:
        md, spec = self._session.metadata, self._session.spec
        return session_binding(
            self._agent,
            str(md["namespace"]),
            str(md["name"]),
            resolve_repo(spec.workspace.repo, self._rt.settings.local_repo_root),
            self._rt.settings,
            self._credential,
            pod=str(self._pod["metadata"]["name"]),
            agent_name=spec.agent_ref,
            checkout=checkout,
        )

    async def known(self, *, checkout: bool) -> None:
        """Return once every gateway replica has the binding; AdoptRefused when one has not
        within the wait."""
        gateway = self._rt.settings.egress_gateway
        if gateway is None:
            return
        text = self.annotations(checkout=checkout)[naming.ANNOTATION_EGRESS_BINDING]
        why = await await_binding(
            self._rt.kube,
            gateway,
            str(self._pod["status"]["podIP"]),
            str(self._pod["metadata"]["uid"]),
            hashlib.sha256(text.encode()).hexdigest(),
        )
        if why is not None:
            raise AdoptRefused(why)

    async def rebind(self) -> None:
        """Bind the adopted pod without the checkout's rule, and wait until it holds."""
        if self._rt.settings.egress_gateway is None:
            return
        md = self._pod["metadata"]
        await self._rt.kube.request(
            "PATCH",
            object_path("v1", "Pod", str(md["namespace"]), str(md["name"])),
            body={"metadata": {"annotations": self.annotations(checkout=False)}},
            content_type="application/merge-patch+json",
        )
        await self.known(checkout=False)


async def _claim(
    rt: Runtime, pod: dict[str, Any], session: Session, binding: dict[str, str]
) -> dict[str, Any] | None:
    """Relabel the pooled pod as the Session's; its key Secret, or None when the pod cannot
    be adopted (its keys are not stored, another Session took it first, or it went)."""
    md = session.metadata
    namespace, pod_name = str(md["namespace"]), str(pod["metadata"]["name"])
    keys = await rt.kube.get(object_path("v1", "Secret", namespace, key_secret_name(pod_name)))
    if keys is None:
        return None  # its keys are not stored yet (or were lost): it cannot be adopted
    owner = owner_reference("Session", str(md["name"]), str(md["uid"]))
    labels = {**sandbox_labels(session), **egress.egress_labels(rt.settings)}
    try:
        await rt.kube.request(
            "PATCH",
            object_path("v1", "Pod", namespace, pod_name),
            body=claim_patch(pod, labels, owner, binding),
            content_type="application/merge-patch+json",
        )
    except (NotFound, Conflict):
        return None  # another Session took it first, or it went
    return keys


def adopt_requests(
    settings: OperatorSettings,
    agent: Agent,
    session: Session,
    wire_token: str,
    credential: str,
    budget: Budget | None,
    egress_credential: str | None = None,
) -> tuple[CustodianAdoptRequest, HarnessAdoptRequest]:
    """What the custodian and the harness of an adopted pod are told of their Session."""
    md = session.metadata
    name, namespace = str(md["name"]), str(md["namespace"])
    spec = session.spec
    repo = resolve_repo(spec.workspace.repo, settings.local_repo_root)
    effective = budget if budget is not None else lowest(spec.budget, agent.spec.limits.budget)
    custodian = CustodianAdoptRequest(
        wireToken=wire_token,
        custodianCredential=credential,
        session=AdoptedSession(name=name, namespace=namespace, uid=str(md["uid"])),
        agentName=spec.agent_ref,
        agent=agent.spec,
        budget=CustodianBudget(
            tokens=effective.tokens,
            costUSD=float(effective.cost_usd) if effective.cost_usd is not None else None,
        ),
        branch=spec.workspace.branch or naming.session_branch(name),
        gitRemoteUrl=repo,
        readOnly=spec.read_only,
        egressCredential=egress_credential if settings.egress_gateway is not None else None,
        memoryDsn=settings.memory_dsn,
    )
    harness = HarnessAdoptRequest(
        wireToken=wire_token,
        custodianCredential=credential,
        grantedRoot=spec.workspace.granted_root,
        readOnly=spec.read_only,
        checkout=CheckoutRequest(
            repo=repo,
            ref=spec.workspace.ref,
            branch=spec.workspace.branch or naming.session_branch(name),
        ),
    )
    return custodian, harness


async def _hand_over(
    rt: Runtime,
    pod: dict[str, Any],
    keys: dict[str, Any],
    custodian: CustodianAdoptRequest,
    harness: HarnessAdoptRequest,
) -> None:
    """Both adopts at once: the harness needs its custodian only when the first turn starts,
    which is after both answered."""
    data = keys.get("data") or {}
    harness_key = base64.b64decode(data[HARNESS_KEY]).decode()
    custodian_key = base64.b64decode(data[CUSTODIAN_KEY]).decode()
    ip = pod["status"]["podIP"]
    settings = rt.settings
    async with httpx.AsyncClient(transport=rt.wire_transport, timeout=ADOPT_TIMEOUT) as client:
        await asyncio.gather(
            _adopt(
                client,
                f"http://{ip}:{settings.custodian_operator_port}/v1/adopt",
                custodian_key,
                custodian,
            ),
            _adopt(client, f"http://{ip}:{settings.harness_port}/adopt", harness_key, harness),
        )


async def _adopt(
    client: httpx.AsyncClient,
    url: str,
    key: str,
    request: HarnessAdoptRequest | CustodianAdoptRequest,
) -> None:
    # The claim just relabelled the pod into its Session's NetworkPolicy, which the network
    # programs asynchronously (kube-router, Calico): a connection may be refused for a moment.
    # A connection that was never made spent no key, so it is tried again, for a while.
    deadline = asyncio.get_running_loop().time() + ADOPT_CONNECT_SECONDS
    while True:
        try:
            response = await client.post(
                url,
                content=request.model_dump_json(by_alias=True),
                headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            )
            break
        except httpx.ConnectError:
            if asyncio.get_running_loop().time() >= deadline:
                raise
            await asyncio.sleep(ADOPT_CONNECT_RETRY)
    if response.status_code != 200:
        raise AdoptRefused(f"{url}: {response.status_code} {response.text[:500]}")
