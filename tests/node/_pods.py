"""Pods for the node tier: restricted-compliant specs, waiting, logs and exec."""

from __future__ import annotations

import json
import time
from typing import Any

from corral_dev.controlplane import ControlPlane

NONROOT = 65534
RESTRICTED: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": NONROOT,
    "runAsGroup": NONROOT,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod(
    name: str,
    namespace: str,
    image: str,
    command: list[str] | None,
    *,
    labels: dict[str, str] | None = None,
    args: list[str] | None = None,
    token: bool = False,
    security: dict[str, Any] | None = None,
    restart: str = "Never",
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "securityContext": security if security is not None else RESTRICTED,
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}},
    }
    if command is not None:
        container["command"] = command
    if args is not None:
        container["args"] = args
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "restartPolicy": restart,
            "automountServiceAccountToken": token,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }


def create(plane: ControlPlane, manifest: dict[str, Any]) -> None:
    plane.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def get(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    done = plane.kubectl("get", "pod", name, "-n", namespace, "-o", "json")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def wait_phase(
    plane: ControlPlane, namespace: str, name: str, phases: set[str], timeout: float = 90
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    current: dict[str, Any] = {}
    while time.monotonic() < deadline:
        current = get(plane, namespace, name)
        if current.get("status", {}).get("phase") in phases:
            return current
        time.sleep(0.5)
    raise AssertionError(
        f"pod {namespace}/{name} not in {phases} after {timeout}s: "
        f"{json.dumps(current.get('status'), indent=1)[-3000:]}"
    )


def wait_ready(plane: ControlPlane, namespace: str, name: str, timeout: float = 90) -> None:
    plane.kubectl(
        "wait",
        "--for=condition=Ready",
        f"--timeout={int(timeout)}s",
        "pod",
        name,
        "-n",
        namespace,
        timeout=timeout + 10,
    )


def logs(plane: ControlPlane, namespace: str, name: str) -> str:
    return plane.kubectl("logs", name, "-n", namespace).stdout


def run_to_end(
    plane: ControlPlane, manifest: dict[str, Any], timeout: float = 90
) -> tuple[str, str]:
    """Create the pod, wait until it ends; (phase, logs)."""
    create(plane, manifest)
    meta = manifest["metadata"]
    done = wait_phase(plane, meta["namespace"], meta["name"], {"Succeeded", "Failed"}, timeout)
    return done["status"]["phase"], logs(plane, meta["namespace"], meta["name"])
