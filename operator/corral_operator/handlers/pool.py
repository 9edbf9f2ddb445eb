"""Warm pool: keep each Agent's pooled sandbox pods started (docs/warm-pool.md, ADR 0074).

Watch-driven: an Agent's events and its pooled pods' events (created, ready, adopted, gone)
reconcile that Agent's pool through the pure planner (`planning.pool`). A Session adopts one
of the pods in its loop's sandbox step (`session.adoption`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import kopf

from corral_api import GROUP, VERSION
from corral_api.kinds import Agent

from .. import naming
from ..builders.poolpod import agent_digest, build_pool_network_policy, build_pool_pod
from ..kube import collection_path, corral_path, object_path
from ..naming import LABEL_POOL
from ..planning.pool import plan_pool, pool_size
from ..runtime import Runtime
from ._common import runtime

log = logging.getLogger("corral.operator.pool")

_locks: dict[tuple[str, str], asyncio.Lock] = {}


@kopf.on.event(GROUP, VERSION, "agents")
async def agent_pool(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    if namespace and name:
        await reconcile_pool(runtime(memo), namespace, name)


@kopf.on.event(
    "", "v1", "pods", labels={naming.LABEL_MANAGED_BY: naming.MANAGED_BY, LABEL_POOL: kopf.PRESENT}
)
async def pooled_pod_changed(
    labels: kopf.Labels, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    agent = labels.get(LABEL_POOL)
    if agent and namespace:
        await reconcile_pool(runtime(memo), namespace, agent)


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
