"""The 1,000-Session benchmark's stand-in sandbox, checked against the real operator.

Its own control plane (a local node on a shared one could take the pods first): the chart's
RBAC, the real `corral-operator`, the stand-in (`corral_dev._standin_sandbox`) as the node and
the pods. Sessions must run to Succeeded over the real wire, the Session's usage must be the
stand-in's custodian record (so the operator read `GET :8082/v1/usage`), and the stand-in must
refuse a wrong wire token the way the harness does.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from corral_api.wire import ErrorBody, SettledEvent, UpdatesResponse
from corral_dev import controlplane, stack
from corral_dev._standin_sandbox import NODE_NAME, TURN_USAGE

NS = "standin"


@pytest.fixture(scope="module")
def standin_cluster() -> Iterator[controlplane.ControlPlane]:
    state = Path(tempfile.mkdtemp(prefix="corral-standin-"))
    plane = controlplane.start(state)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        controlplane.install_crds(plane)
        plane.kubectl("create", "namespace", NS)
        stack.enforce_restricted(plane, NS)
        controlplane.wait_for_default_service_account(plane, NS)
        standin = subprocess.Popen(
            [sys.executable, "-m", "corral_dev._standin_sandbox", "--kubeconfig",
             str(plane.kubeconfig), "--namespace", NS, "--turn-seconds", "0.2"],
            stdout=subprocess.PIPE,
            stderr=(state / "standin.log").open("wb"),
        )  # fmt: skip
        procs.append(standin)
        assert standin.stdout is not None
        assert standin.stdout.readline().strip() == b"ready", (state / "standin.log").read_text()
        stack.install_rbac(plane, f"corral-{NS}", NS)
        kubeconfig = stack.identity_kubeconfig(plane, stack.OPERATOR_NAMESPACE, stack.OPERATOR_SA)
        health = controlplane.free_port()
        args = stack.operator_args(
            plane,
            kubeconfig=kubeconfig,
            namespaces=[NS],
            health_port=health,
            model_url="http://127.0.0.1:9",  # never called: the stand-in runs no model
        )
        log = state / "operator.log"
        procs.append(stack.start_operator(args, log))
        stack.wait_serving("the operator", f"http://127.0.0.1:{health}/healthz", procs[-1], log)
        yield plane
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        plane.stop()


def _get(plane: controlplane.ControlPlane, *args: str) -> dict[str, Any]:
    return dict(json.loads(plane.kubectl("get", *args, "-n", NS, "-o", "json").stdout))


def _wait_phase(plane: controlplane.ControlPlane, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        status = _get(plane, "session", name).get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed", "Stopped"):
            return status
        time.sleep(0.2)
    raise AssertionError(f"session {name} did not finish: {status}")


def _apply(plane: controlplane.ControlPlane, *docs: dict[str, Any]) -> None:
    plane.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump_all(list(docs)))


def _session(name: str, **spec: Any) -> dict[str, Any]:
    body = {"agentRef": "coder", "task": "Say done.", "workspace": {"repo": "/nowhere"}, **spec}
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "Session",
            "metadata": {"name": name}, "spec": body}  # fmt: skip


def test_sessions_run_to_succeeded_on_the_stand_in_with_its_usage_record(
    standin_cluster: controlplane.ControlPlane,
) -> None:
    plane = standin_cluster
    agent = {"apiVersion": "corral.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "coder"},
             "spec": {"identity": "You code.", "model": "corral-scripted"}}  # fmt: skip
    _apply(plane, agent, *(_session(f"s{i}") for i in range(3)))
    for i in range(3):
        status = _wait_phase(plane, f"s{i}")
        assert status["phase"] == "Succeeded", status
        # The custodian's record (the stand-in's), never the harness's report.
        assert status["usage"]["inputTokens"] == TURN_USAGE.input
        assert status["usage"]["outputTokens"] == TURN_USAGE.output
    deadline = time.monotonic() + 30
    while _get(plane, "pods")["items"] and time.monotonic() < deadline:
        time.sleep(0.2)  # released by the operator, removed by the stand-in as a kubelet would
    assert _get(plane, "pods")["items"] == []


def test_the_stand_in_speaks_the_wire_and_refuses_a_wrong_token(
    standin_cluster: controlplane.ControlPlane,
) -> None:
    plane = standin_cluster
    _apply(plane, _session("kept", keepSandbox=True))
    assert _wait_phase(plane, "kept")["phase"] == "Succeeded"
    pod = _get(plane, "pod", "corral-kept")
    assert pod["spec"]["nodeName"] == NODE_NAME
    base = f"http://{pod['status']['podIP']}:8080/agents/coder"
    secret = _get(plane, "secret", "corral-kept-wire")
    token = base64.b64decode(secret["data"]["token"]).decode()

    wrong = httpx.get(f"{base}/kept/history", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert ErrorBody.model_validate(wrong.json()).error == "unauthorized"

    auth = {"Authorization": f"Bearer {token}"}
    history = UpdatesResponse.model_validate(httpx.get(f"{base}/kept/history", headers=auth).json())
    settled = [e for e in history.events if e["type"] == "settled"]
    assert [SettledEvent.model_validate({k: v for k, v in e.items() if k != "ts"}).status
            for e in settled] == ["completed"]  # fmt: skip
    unknown = httpx.get(f"{base}/nobody/updates", headers=auth)
    assert unknown.status_code == 404
    assert ErrorBody.model_validate(unknown.json()).error == "unknown_conversation"
    bad = httpx.post(f"{base}/kept", headers=auth, json={"message": ""})
    assert bad.status_code == 400  # AdmitRequest's own validation: an empty message
