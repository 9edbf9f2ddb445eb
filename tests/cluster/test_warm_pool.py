"""The warm pool on the real API server and the local node (docs/warm-pool.md).

An Agent with `sandbox.warmPool` gets pooled pods (real harness, tools and custodian processes)
that answer nothing but `/readyz` and adopt; a Session adopts one, late-binds it through the
operator's one-time keys, and completes a turn against the scripted model; the pool refills;
an Agent change replaces the pool; a second adopt and a wrong key are refused.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_dev.controlplane import ControlPlane
from corral_operator.builders.poolpod import ANNOTATION_DIGEST, LABEL_POOL

from ._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    get_json,
    session_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)

HARNESS_PORT, CUSTODIAN_OPERATOR_PORT = 8080, 8082


def _pool(op: OperatorHandle, agent: str = "coder") -> list[dict[str, Any]]:
    found = get_json(
        op.cp,
        "pods",
        "-n",
        op.namespace,
        "-l",
        f"{LABEL_POOL}={agent},app.kubernetes.io/component=pool",
    )
    return [
        p for p in (found or {}).get("items") or [] if not p["metadata"].get("deletionTimestamp")
    ]


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _ready_pool(op: OperatorHandle, size: int, timeout: float = 90) -> list[dict[str, Any]]:
    def probe() -> list[dict[str, Any]] | None:
        pods = _pool(op)
        return pods if len(pods) == size and all(_ready(p) for p in pods) else None

    try:
        return wait_for(f"{size} ready pooled pods", probe, timeout)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{op.logs()[-4000:]}") from None


def _keys(op: OperatorHandle, pod: str) -> dict[str, str]:
    secret = get_json(op.cp, "secret", f"{pod}-adopt", "-n", op.namespace)
    assert secret is not None, f"no key Secret for {pod}"
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_a_session_adopts_a_warm_pod_the_pool_refills_and_an_agent_change_rolls_it(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    operator.apply(agent_doc(sandbox={"warmPool": {"size": 2}}))
    pool = _ready_pool(operator, 2)
    first = pool[0]
    ip = first["status"]["podIP"]
    harness, custodian_op = f"http://{ip}:{HARNESS_PORT}", f"http://{ip}:{CUSTODIAN_OPERATOR_PORT}"

    # Before adoption a pooled pod answers readyz and adopt only.
    assert httpx.get(f"{harness}/readyz", timeout=5).json() == {"ready": True, "adopted": False}
    for method, url in (
        ("POST", f"{harness}/agents/coder/c1"),
        ("GET", f"{harness}/agents/coder/c1/history"),
        ("POST", f"{harness}/checks"),
        ("GET", f"{custodian_op}/v1/usage"),
    ):
        refused = httpx.request(method, url, timeout=5)
        assert refused.status_code == 423, (url, refused.text)
    # A wrong key is refused and spends nothing; the pod spec holds no key, only its digest.
    assert (
        httpx.post(
            f"{harness}/adopt", json={}, headers={"authorization": "Bearer nope"}, timeout=5
        ).status_code
        == 401
    )
    assert httpx.post(f"{custodian_op}/v1/adopt", json={}, timeout=5).status_code == 401
    keys = _keys(operator, first["metadata"]["name"])
    spec_text = json.dumps(first["spec"])
    assert keys["harness"] not in spec_text and keys["custodian"] not in spec_text

    # A Session adopts a pooled pod and completes its turn in the checked-out repository.
    name = f"{operator.namespace}-warm"
    scripted_model.load({"conversations": {name: [{"text": "Warm and done."}]}})
    operator.apply(session_doc(name, git_repo, keepSandbox=True))
    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    adopted = status["podName"]
    assert adopted in {p["metadata"]["name"] for p in pool}, status
    assert len(scripted_model.requests(name)) == 1
    assert "SandboxAdopted" in [e["reason"] for e in operator.events(name)]
    pod = operator.get("pod", adopted)
    assert pod is not None
    labels = pod["metadata"]["labels"]
    assert (
        labels["corral.dev/session"] == name and labels["app.kubernetes.io/component"] == "sandbox"
    )
    assert [r["kind"] for r in pod["metadata"]["ownerReferences"]] == ["Session"]

    # The key is spent: the operator's own key cannot adopt the pod a second time.
    ip = pod["status"]["podIP"]
    keys = _keys(operator, adopted)
    again = httpx.post(
        f"http://{ip}:{HARNESS_PORT}/adopt",
        json={},
        headers={"authorization": f"Bearer {keys['harness']}"},
        timeout=5,
    )
    assert again.status_code == 409, again.text
    again = httpx.post(
        f"http://{ip}:{CUSTODIAN_OPERATOR_PORT}/v1/adopt",
        json={},
        headers={"authorization": f"Bearer {keys['custodian']}"},
        timeout=5,
    )
    assert again.status_code == 409, again.text

    # The pool refills to its size without the adopted pod.
    refilled = _ready_pool(operator, 2)
    assert adopted not in {p["metadata"]["name"] for p in refilled}

    # An Agent change replaces every pooled pod with one built from the new spec.
    old_names = {p["metadata"]["name"] for p in refilled}
    old_digest = refilled[0]["metadata"]["annotations"][ANNOTATION_DIGEST]
    operator.apply(agent_doc(instructions="Be brief.", sandbox={"warmPool": {"size": 2}}))

    def rolled() -> list[dict[str, Any]] | None:
        pods = _pool(operator)
        fresh = [p for p in pods if p["metadata"]["annotations"][ANNOTATION_DIGEST] != old_digest]
        done = len(pods) == 2 and len(fresh) == 2 and all(_ready(p) for p in pods)
        return pods if done else None

    after = wait_for("the pool to roll", rolled, 120)
    assert not old_names & {p["metadata"]["name"] for p in after}


def test_sessions_fall_back_to_cold_pods_when_the_pool_is_empty(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    # Applied together: the Session comes before any pooled pod is ready (a pooled pod takes
    # seconds to start, the Session's sandbox is decided within a second), so it does not
    # wait for one and gets its own cold pod; the pool still fills.
    name = f"{operator.namespace}-cold"
    scripted_model.load({"conversations": {name: [{"text": "Cold and done."}]}})
    operator.apply(agent_doc(sandbox={"warmPool": {"size": 1}}), session_doc(name, git_repo))
    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    assert status["podName"] == f"corral-{name}"
    assert "SandboxAdopted" not in [e["reason"] for e in operator.events(name)]
    _ready_pool(operator, 1)


def test_the_api_server_refuses_a_warm_pool_it_cannot_serve(
    control_plane: ControlPlane, namespace: str
) -> None:
    def apply(spec: dict[str, Any]) -> str:
        doc = agent_doc(**spec)
        doc["metadata"]["namespace"] = namespace
        done = control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc), check=False)
        assert done.returncode != 0, done.stdout
        return done.stderr

    credentialed = {"credentials": {"gitSecretRef": {"name": "git", "key": "credentials"}}}
    refused = apply({"sandbox": {"warmPool": {"size": 1}}, **credentialed})
    assert "warmPool cannot be used with credentials.gitSecretRef" in refused
    assert "spec.sandbox.warmPool.size" in apply({"sandbox": {"warmPool": {"size": 51}}})
    assert "spec.sandbox.warmPool.size" in apply({"sandbox": {"warmPool": {"size": -1}}})
