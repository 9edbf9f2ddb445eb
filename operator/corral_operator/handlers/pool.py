"""Warm pool: keep each Agent's pooled sandbox pods started, and let a Session adopt one.

Watch-driven: an Agent's events and its pooled pods' events (created, ready, adopted, gone)
reconcile that Agent's pool through the pure planner (`planning.pool`). A Session's loop calls
`adopt_pooled_pod` once its Secret and NetworkPolicy exist; it claims a ready pod of the
current Agent digest with a compare-and-swap relabel (the Session's policy now selects it, the
pool's no longer does), then hands the custodian and the harness their Session through their
adopt endpoints with the pod's one-time keys (spent by that adopt; their Secret goes with the
pod). Any failure deletes the pod and the Session tries the next, then a cold pod
(docs/warm-pool.md, ADR 0074).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import kopf

from corral_api import GROUP, VERSION
from corral_api.kinds import Agent, Budget, Session
from corral_api.wire import (
    AdoptedSession,
    CheckoutRequest,
    CustodianAdoptRequest,
    CustodianBudget,
    HarnessAdoptRequest,
)

from .. import naming
from ..kube import KubeError, collection_path, corral_path, object_path
from ..planning.lineage import lowest
from ..planning.pool import adoptable, claim_patch, plan_pool, pool_size, warm_refusal
from ..podbuilder import owner_reference, resolve_repo, sandbox_labels
from ..poolpod import (
    CUSTODIAN_KEY,
    HARNESS_KEY,
    LABEL_POOL,
    agent_digest,
    build_pool_network_policy,
    build_pool_pod,
    key_secret_name,
)
from ..runtime import Runtime
from ._common import runtime

log = logging.getLogger("corral.operator.pool")

ADOPT_TIMEOUT = httpx.Timeout(300.0, connect=5.0)  # the harness's adopt includes the checkout
_locks: dict[tuple[str, str], asyncio.Lock] = {}


@kopf.on.event(GROUP, VERSION, "agents")
async def agent_pool(**kw: Any) -> None:
    if kw["namespace"] and kw["name"]:
        await reconcile_pool(runtime(kw["memo"]), kw["namespace"], kw["name"])


@kopf.on.event(
    "", "v1", "pods", labels={naming.LABEL_MANAGED_BY: naming.MANAGED_BY, LABEL_POOL: kopf.PRESENT}
)
async def pooled_pod_changed(**kw: Any) -> None:
    agent = kw["labels"].get(LABEL_POOL)
    if agent and kw["namespace"]:
        await reconcile_pool(runtime(kw["memo"]), kw["namespace"], agent)


def _agent(body: dict[str, Any]) -> Agent:
    return Agent.model_validate({k: body[k] for k in ("metadata", "spec")})


async def reconcile_pool(rt: Runtime, namespace: str, agent_name: str) -> None:
    """Bring one Agent's pool to its size: remove finished, stale and surplus pods, start the
    missing ones. One at a time per Agent, so two events never start the same pod twice."""
    lock = _locks.setdefault((namespace, agent_name), asyncio.Lock())
    async with lock:
        body = await rt.kube.get(corral_path("Agent", namespace, agent_name))
        size = pool_size(body)
        pods = await rt.kube.list(
            collection_path("v1", "Pod", namespace),
            f"{LABEL_POOL}={naming.label_value(agent_name)}",
        )
        agent = _agent(body) if body is not None and size else None
        digest = agent_digest(agent, rt.settings) if agent is not None else ""
        plan = plan_pool(size, digest, pods)
        for name in plan.delete:
            log.info("pool %s/%s: removing %s: %s", namespace, agent_name, name, plan.reasons[name])
            await _remove(rt, namespace, name)
        if agent is None or not plan.create:
            return
        await rt.kube.create(build_pool_network_policy(agent, rt.settings))
        for _ in range(plan.create):
            name = f"corral-warm-{agent_name[:40]}-{secrets.token_hex(4)}"
            manifests = build_pool_pod(
                agent, rt.settings, name, secrets.token_urlsafe(32), secrets.token_urlsafe(32)
            )
            pod = manifests.pod
            created = await rt.kube.request(
                "POST", collection_path("v1", "Pod", namespace), body=pod
            )
            await rt.kube.create(manifests.key_secret(str(created["metadata"]["uid"])))
            log.info("pool %s/%s: started %s", namespace, agent_name, name)


async def _remove(rt: Runtime, namespace: str, pod: str) -> None:
    # Its key Secret is the pod's: the garbage collector removes it with the pod.
    await rt.kube.delete(object_path("v1", "Pod", namespace, pod))


# ------------------------------------------------------------------------------ adoption

Post = Callable[[str, str, dict[str, Any]], Awaitable[None]]


async def adopt_pooled_pod(
    rt: Runtime,
    agent: Agent,
    session: Session,
    wire_token: str,
    custodian_credential: str,
    budget: Budget | None,
) -> str | None:
    """Adopt a pooled pod for `session`; its name, or None when the Session needs a cold pod.

    Call only once the Session's Secret and NetworkPolicy exist: the claim relabels the pod
    into that policy before it holds anything of the Session's.
    """
    if warm_refusal(agent, session) is not None:
        return None
    md = session.metadata
    name, namespace, uid = str(md["name"]), str(md["namespace"]), str(md["uid"])
    agent_name = str(agent.metadata["name"])
    pods = await rt.kube.list(
        collection_path("v1", "Pod", namespace), f"{LABEL_POOL}={naming.label_value(agent_name)}"
    )
    owner = owner_reference("Session", name, uid)
    started = time.monotonic()
    for pod in adoptable(pods, agent_digest(agent, rt.settings)):
        pod_name = str(pod["metadata"]["name"])
        path = object_path("v1", "Pod", namespace, pod_name)
        keys = await rt.kube.get(object_path("v1", "Secret", namespace, key_secret_name(pod_name)))
        if keys is None:
            continue  # its keys are not stored yet (or were lost): it cannot be adopted
        try:
            await rt.kube.request(
                "PATCH",
                path,
                body=claim_patch(pod, sandbox_labels(session), owner),
                content_type="application/merge-patch+json",
            )
        except KubeError as err:
            if err.status in (404, 409):
                continue  # another Session took it first, or it went
            raise
        claimed = time.monotonic()
        try:
            await _hand_over(
                rt, pod, keys, agent, session, wire_token, custodian_credential, budget
            )
        except (KubeError, httpx.HTTPError, AdoptRefused) as err:
            # The pod spent its keys (or may have): it serves no one now.
            log.warning("session %s/%s: adopting %s failed: %s", namespace, name, pod_name, err)
            await _remove(rt, namespace, pod_name)
            continue
        log.info(
            "session %s/%s: adopted %s in %.3f s (claim %.3f s)",
            namespace, name, pod_name, time.monotonic() - started, claimed - started,
        )  # fmt: skip
        return pod_name
    return None


class AdoptRefused(Exception):
    """The pod answered an adopt with something other than success."""


async def _hand_over(
    rt: Runtime,
    pod: dict[str, Any],
    keys: dict[str, Any],
    agent: Agent,
    session: Session,
    wire_token: str,
    credential: str,
    budget: Budget | None,
) -> None:
    md = session.metadata
    name, namespace = str(md["name"]), str(md["namespace"])
    data = keys.get("data") or {}
    harness_key = base64.b64decode(data[HARNESS_KEY]).decode()
    custodian_key = base64.b64decode(data[CUSTODIAN_KEY]).decode()
    ip = pod["status"]["podIP"]
    spec = session.spec
    repo = resolve_repo(spec.workspace.repo, rt.settings.local_repo_root)
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
    settings = rt.settings
    async with httpx.AsyncClient(transport=rt.wire_transport, timeout=ADOPT_TIMEOUT) as client:

        async def adopt(
            url: str, key: str, request: HarnessAdoptRequest | CustodianAdoptRequest
        ) -> None:
            response = await client.post(
                url,
                content=request.model_dump_json(by_alias=True),
                headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            )
            if response.status_code != 200:
                raise AdoptRefused(f"{url}: {response.status_code} {response.text[:500]}")

        # Both at once: the harness needs its custodian only when the first turn starts, which
        # is after both answered.
        await asyncio.gather(
            adopt(
                f"http://{ip}:{settings.custodian_operator_port}/v1/adopt", custodian_key, custodian
            ),
            adopt(f"http://{ip}:{settings.harness_port}/adopt", harness_key, harness),
        )
