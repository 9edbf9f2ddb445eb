"""A Session adopts a pod of its Agent's warm pool (docs/warm-pool.md, ADR 0074).

The sandbox step calls `adopt_pooled_pod` once the Session's Secret and NetworkPolicy exist; it
claims a ready pod of the current Agent digest with a compare-and-swap relabel (the Session's
policy now selects it, the pool's no longer does), then hands the custodian and the harness
their Session through their adopt endpoints with the pod's one-time keys (spent by that adopt;
their Secret goes with the pod). Any failure deletes the pod and the Session tries the next,
then a cold pod. The pool itself is kept by its handlers (`handlers.pool`).
"""

from __future__ import annotations

import asyncio
import base64
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
from ..builders.podbuilder import owner_reference, resolve_repo, sandbox_labels
from ..builders.poolpod import CUSTODIAN_KEY, HARNESS_KEY, LABEL_POOL, agent_digest, key_secret_name
from ..kube import collection_path, object_path
from ..planning.pool import adoptable, claim_patch, warm_refusal
from ..runtime import Runtime
from ..settings import OperatorSettings

log = logging.getLogger("corral.operator.pool")

ADOPT_TIMEOUT = httpx.Timeout(300.0, connect=5.0)  # the harness's adopt includes the checkout


class AdoptRefused(Exception):
    """The pod answered an adopt with something other than success."""


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
    if warm_refusal(agent, session) is not None or rt.settings.egress_gateway is not None:
        return None
    md = session.metadata
    name, namespace = str(md["name"]), str(md["namespace"])
    agent_name = str(agent.metadata["name"])
    pods = await rt.kube.list(
        collection_path("v1", "Pod", namespace), f"{LABEL_POOL}={naming.label_value(agent_name)}"
    )
    started = time.monotonic()
    for pod in adoptable(pods, agent_digest(agent, rt.settings)):
        pod_name = str(pod["metadata"]["name"])
        keys = await _claim(rt, pod, session)
        if keys is None:
            continue
        claimed = time.monotonic()
        try:
            told = adopt_requests(
                rt.settings, agent, session, wire_token, custodian_credential, budget
            )
            await _hand_over(rt, pod, keys, *told)
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


async def _claim(rt: Runtime, pod: dict[str, Any], session: Session) -> dict[str, Any] | None:
    """Relabel the pooled pod as the Session's; its key Secret, or None when the pod cannot
    be adopted (its keys are not stored, another Session took it first, or it went)."""
    md = session.metadata
    namespace, pod_name = str(md["namespace"]), str(pod["metadata"]["name"])
    keys = await rt.kube.get(object_path("v1", "Secret", namespace, key_secret_name(pod_name)))
    if keys is None:
        return None  # its keys are not stored yet (or were lost): it cannot be adopted
    owner = owner_reference("Session", str(md["name"]), str(md["uid"]))
    try:
        await rt.kube.request(
            "PATCH",
            object_path("v1", "Pod", namespace, pod_name),
            body=claim_patch(pod, sandbox_labels(session), owner),
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
    response = await client.post(
        url,
        content=request.model_dump_json(by_alias=True),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    if response.status_code != 200:
        raise AdoptRefused(f"{url}: {response.status_code} {response.text[:500]}")
