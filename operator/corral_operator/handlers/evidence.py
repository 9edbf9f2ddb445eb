"""Evidence: run the check in its own clean pod, behind its own NetworkPolicy, and write the
verdict once."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import kopf

from corral_api import GROUP, VERSION
from corral_api.kinds import Evidence
from corral_api.labels import EVIDENCE_SESSION
from corral_kube import KubeError

from .. import naming
from ..builders.evidencepod import CHECK_CONTAINER, EvidenceSpecError, build_evidence_manifests
from ..kube import corral_path, object_path
from ..planning.evidence import plan_evidence, verdict_on_session
from ..planning.patch import merge_patch
from ..planning.session import PlannedEvent, now_text
from ..runtime import Runtime, post_event
from ._common import namespace_of, now, runtime

_RECHECK = 5.0


@kopf.daemon(GROUP, VERSION, "evidences", cancellation_timeout=5.0)
async def evidence_daemon(
    name: str,
    namespace: str | None,
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    rt, namespace = runtime(memo), namespace_of(namespace)
    path = corral_path("Evidence", namespace, name)
    pod_path = object_path("v1", "Pod", namespace, naming.evidence_pod_name(name))
    wake = rt.wakeup(namespace, name)
    try:
        while not stopped:
            wake.clear()
            body = await rt.kube.get(path)
            if body is None or (body.get("status") or {}).get("verdict") not in (None, "Pending"):
                return
            pod = await rt.kube.get(pod_path)
            plan = plan_evidence(body, pod, now_text(now()))
            if plan.finished and pod is not None:
                tail = await _log_tail(rt, pod_path)
                plan = plan_evidence(body, pod, now_text(now()), tail)
            if plan.create_pod and (refusal := await _start_check(rt, body)) is not None:
                plan = plan_evidence(body, None, now_text(now()), refusal=refusal)
            if plan.changed:
                patch = merge_patch(body.get("status") or {}, plan.status)
                await rt.kube.patch_status(path, patch)
            if plan.status.get("verdict") != "Pending":
                verdict = plan.status["verdict"]
                post_event(
                    body,
                    PlannedEvent(
                        "Normal" if verdict == "Pass" else "Warning",
                        f"Verdict{verdict}",
                        f"{body['spec']['check']} at {body['spec']['revision'][:12]}: {verdict}",
                    ),
                )
                await _tell_session(rt, body, verdict)
                await rt.kube.delete(pod_path)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=_RECHECK)
    finally:
        rt.forget(namespace, name)


async def _tell_session(rt: Runtime, evidence: dict[str, Any], verdict: str) -> None:
    """The verdict as an Event on the Session that asked for the Evidence (its label), so
    `kubectl describe session` shows what gated its landing."""
    session_name = (evidence.get("metadata", {}).get("labels") or {}).get(EVIDENCE_SESSION)
    if not session_name:
        return
    namespace = evidence["metadata"]["namespace"]
    session = await rt.kube.get(corral_path("Session", namespace, session_name))
    if session is not None:
        post_event(session, verdict_on_session(evidence, verdict))


async def _start_check(rt: Runtime, body: dict[str, Any]) -> str | None:
    """Create the NetworkPolicy, then the pod; or say why they cannot be built."""
    evidence = Evidence.model_validate({k: body[k] for k in ("metadata", "spec")})
    try:
        manifests = build_evidence_manifests(evidence, rt.settings)
    except EvidenceSpecError as err:
        return str(err)
    for manifest in manifests.all():
        await rt.kube.create(manifest)
    return None


async def _log_tail(rt: Runtime, pod_path: str) -> str | None:
    try:
        text = await rt.kube.request(
            "GET", f"{pod_path}/log", query=[("container", CHECK_CONTAINER), ("tailLines", "200")]
        )
    except KubeError:
        return None  # the node may not serve logs; the termination message stands in
    return text if isinstance(text, str) else None


@kopf.on.event(
    "",
    "v1",
    "pods",
    labels={naming.LABEL_MANAGED_BY: naming.MANAGED_BY, naming.LABEL_COMPONENT: "evidence"},
)
def evidence_pod_changed(
    labels: kopf.Labels, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    evidence = labels.get(naming.LABEL_EVIDENCE)
    if evidence and namespace:
        runtime(memo).wake(namespace, evidence)
