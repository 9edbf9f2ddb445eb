"""The custodian as a container of a pod on the local node: its only credential to the API
server is the projected, audience-bound service-account token the node fills in, and with it
the custodian reads its Agent and creates a child Session under the chart's sandbox RBAC. It
answers only the pod-local credential on its harness port, and only the wire token on its
operator port.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import httpx
import pytest

from corral_dev.controlplane import API_AUDIENCE, REPO_ROOT, ControlPlane

from ._node_fixtures import LocalNodeHandle

pytestmark = pytest.mark.timeout(120)

RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


POD_IP = {"fieldPath": "status.podIP"}


def env(name: str, value: str) -> dict[str, str]:
    return {"name": name, "value": value}


def test_a_custodian_pod_uses_its_projected_token_to_create_a_child(
    control_plane: ControlPlane, namespace: str, local_node: LocalNodeHandle
) -> None:
    rbac = subprocess.run(
        [
            str(control_plane.bin_dir / "helm"), "template", "corral",
            str(REPO_ROOT / "charts" / "corral"), "--kube-version", "1.34.4",
            "--show-only", "templates/sandbox-rbac.yaml",
            "--set", f"sandboxNamespaces={{{namespace}}}",
        ],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    control_plane.kubectl("apply", "-f", "-", input=rbac)
    parent = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": "lead", "namespace": namespace},
        "spec": {
            "agentRef": "coder",
            "task": "split the work",
            "workspace": {"repo": "https://example.invalid/r.git"},
        },
    }
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(parent))
    uid = control_plane.kubectl(
        "get", "session", "lead", "-n", namespace, "-o", "jsonpath={.metadata.uid}"
    ).stdout
    control_plane.kubectl(
        "create", "secret", "generic", "model", "-n", namespace, "--from-literal=key=sk-test-key"
    )
    credential, wire_token = "pod-local-credential-4711", "wire-token-0815"
    control_plane.kubectl(
        "create", "secret", "generic", "pod-local", "-n", namespace,
        f"--from-literal=credential={credential}", f"--from-literal=token={wire_token}",
    )  # fmt: skip
    # The API server's CA, as the chart's kubeCaConfigMap would hold it.
    control_plane.kubectl(
        "create",
        "configmap",
        "api-ca",
        "-n",
        namespace,
        f"--from-file=ca.crt={control_plane.ca_file}",
    )
    agent = {
        "identity": "x",
        "model": "claude-haiku-4-5",
        "orchestrator": True,
        "tools": {"allow": ["mcp__corral__*"]},
    }
    # The custodian reads its Agent from the API server (the Session's agentRef).
    control_plane.kubectl(
        "apply", "-f", "-",
        input=json.dumps({"apiVersion": "corral.dev/v1alpha1", "kind": "Agent",
                          "metadata": {"name": "coder", "namespace": namespace}, "spec": agent}),
    )  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "lead-sandbox", "namespace": namespace},
        "spec": {
            "serviceAccountName": "corral-sandbox",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "custodian",
                    "image": "corral/sandbox:ignored",
                    "command": ["corral-custodian"],
                    "securityContext": RESTRICTED,
                    "env": [
                        {"name": "POD_IP", "valueFrom": {"fieldRef": POD_IP}},
                        env("CORRAL_CUSTODIAN_ADDR", "$(POD_IP):8081"),
                        env("CORRAL_CUSTODIAN_OPERATOR_ADDR", "$(POD_IP):8082"),
                        env("CORRAL_CUSTODIAN_CREDENTIAL_FILE", "/var/run/corral/pod/credential"),
                        env("CORRAL_WIRE_TOKEN_FILE", "/var/run/corral/pod/token"),
                        env("CORRAL_SESSION_NAME", "lead"),
                        env("CORRAL_SESSION_NAMESPACE", namespace),
                        env("CORRAL_SESSION_UID", uid),
                        env("CORRAL_KUBE_API", control_plane.server),
                        env("CORRAL_KUBE_TOKEN_FILE", "/var/run/corral/kube/token"),
                        env("CORRAL_KUBE_CA_FILE", "/var/run/corral/ca/ca.crt"),
                        env("CORRAL_STATE_DIR", "/state"),
                        {
                            "name": "ANTHROPIC_API_KEY",
                            "valueFrom": {"secretKeyRef": {"name": "model", "key": "key"}},
                        },
                    ],
                    "ports": [
                        {"name": "custodian", "containerPort": 8081},
                        {"name": "operator", "containerPort": 8082},
                    ],
                    "readinessProbe": {
                        "httpGet": {"path": "/readyz", "port": "custodian"},
                        "periodSeconds": 1,
                    },
                    "volumeMounts": [
                        {"name": "kube-token", "mountPath": "/var/run/corral/kube"},
                        {"name": "kube-ca", "mountPath": "/var/run/corral/ca"},
                        {"name": "state", "mountPath": "/state"},
                        {"name": "pod-local", "mountPath": "/var/run/corral/pod"},
                    ],
                }
            ],
            "volumes": [
                {
                    "name": "kube-token",
                    "projected": {
                        "sources": [
                            {
                                "serviceAccountToken": {
                                    "audience": API_AUDIENCE,
                                    "expirationSeconds": 3600,
                                    "path": "token",
                                }
                            }
                        ]
                    },
                },
                {"name": "kube-ca", "configMap": {"name": "api-ca"}},
                {"name": "state", "emptyDir": {}},
                {"name": "pod-local", "secret": {"secretName": "pod-local"}},
            ],
        },
    }  # fmt: skip
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(pod))

    deadline = time.monotonic() + 60
    while True:
        live: dict[str, Any] = json.loads(
            control_plane.kubectl(
                "get", "pod", "lead-sandbox", "-n", namespace, "-o", "json"
            ).stdout
        )
        ready = [c for c in live["status"].get("conditions", []) if c["type"] == "Ready"]
        if ready and ready[0]["status"] == "True":
            break
        assert time.monotonic() < deadline, local_node.log.read_text()[-3000:]
        time.sleep(0.2)

    url = f"http://{live['status']['podIP']}:8081"
    assert httpx.get(f"{url}/agents/c/surface").status_code == 401
    headers = {"authorization": f"Bearer {credential}"}
    tools = [
        t["name"] for t in httpx.get(f"{url}/agents/c/surface", headers=headers).json()["tools"]
    ]
    assert "spawn_child" in tools
    answer = httpx.post(
        f"{url}/agents/c/tools/spawn_child", json={"task": "half"}, headers=headers
    ).json()
    assert answer["isError"] is False, answer
    child = json.loads(answer["content"])["child"]
    got = json.loads(
        control_plane.kubectl("get", "session", child, "-n", namespace, "-o", "json").stdout
    )
    assert got["spec"]["parentRef"] == {"name": "lead", "uid": uid}

    # The operator port, in the same process: the wire token only, and the usage record.
    operator = f"http://{live['status']['podIP']}:8082/v1/usage"
    assert httpx.get(operator, headers=headers).status_code == 401
    usage = httpx.get(operator, headers={"authorization": f"Bearer {wire_token}"})
    assert usage.status_code == 200, usage.text
    assert usage.json()["usage"]["input"] == 0 and usage.json()["exceeded"] is False
