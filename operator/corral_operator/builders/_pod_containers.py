"""The sandbox pod's containers, one builder each: the init containers (the exec service's
install, the checkout) and the harness, the tools and the custodian (docs/decisions/0060),
with the variables and mounts every pod gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral_common.checkout import CHECKOUT_GIT_ENV, CHECKOUT_SCRIPT

from ..settings import OperatorSettings
from ._pod_layout import (
    CUSTODIAN_CREDENTIAL_KEY,
    CUSTODIAN_STATE_MOUNT,
    EXEC_BIN_DIR,
    EXEC_BINARY,
    EXEC_SOCKET,
    EXEC_SOCKET_DIR,
    KUBE_TOKEN_DIR,
    POD_IP_ENV,
    STATE_MOUNT,
    WIRE_DIR,
    WIRE_TOKEN_KEY,
    WORKSPACE_MOUNT,
    env,
    mount,
)

_WIRE_TOKEN_FILE = f"{WIRE_DIR}/{WIRE_TOKEN_KEY}"
_CREDENTIAL_FILE = f"{WIRE_DIR}/{CUSTODIAN_CREDENTIAL_KEY}"


@dataclass(frozen=True)
class SessionFacts:
    """What the containers are told of their Session, as the pod builder resolved and checked
    it: its names, its Agent, and the checkout (the repository already resolved)."""

    name: str
    namespace: str
    uid: str
    agent_name: str
    agent_spec_json: str
    repo: str
    ref: str
    branch: str
    granted_root: str
    read_only: bool


def pod_ip_env() -> dict[str, Any]:
    return {
        "name": POD_IP_ENV,
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
    }


def _flag(value: bool) -> str:
    return "true" if value else "false"


# ----------------------------------------------------------------------- init containers


def install_exec_container(settings: OperatorSettings, security: dict[str, Any]) -> dict[str, Any]:
    """The exec service onto its volume, from Corral's image."""
    return {
        "name": "install-exec",
        "image": settings.image,
        "command": ["corral-exec", "install", EXEC_BIN_DIR],
        "volumeMounts": [mount("exec-bin", EXEC_BIN_DIR)],
        "resources": settings.resources.install_exec.wire(),
        "securityContext": dict(security),
    }


# The checkout runs as the tools uid, with git credentials when the Agent has them. It runs
# again in this pod after a node or runtime restart, when the agent has had the workspace and
# its /tmp: its HOME and /tmp are a volume no other container mounts, and the script reads no
# git configuration but its command line's (corral_common.checkout).


def checkout_mounts() -> list[dict[str, Any]]:
    return [mount("workspace", WORKSPACE_MOUNT), mount("checkout-home", "/tmp")]


def checkout_args(facts: SessionFacts) -> list[str]:
    return [
        "-c",
        CHECKOUT_SCRIPT,
        "checkout",
        facts.repo,
        facts.ref,
        facts.branch,  # the session branch itself, which the checkout refuses when the ref names it
        WORKSPACE_MOUNT,
    ]


def checkout_container(
    settings: OperatorSettings,
    args: list[str],
    mounts: list[dict[str, Any]],
    security: dict[str, Any],
    extra_env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "name": "checkout",
        "image": settings.image,
        "command": ["sh"],
        "args": args,
        "env": [
            env("HOME", "/tmp"),
            *(env(k, v) for k, v in CHECKOUT_GIT_ENV),
            *(extra_env or []),
        ],
        "volumeMounts": mounts,
        "resources": settings.resources.checkout.wire(),
        "securityContext": dict(security),
    }


# ------------------------------------------------------------------------------- harness


def harness_env(
    facts: SessionFacts, settings: OperatorSettings, pod_ip: dict[str, Any]
) -> list[dict[str, Any]]:
    custodian_url = f"http://$({POD_IP_ENV}):{settings.custodian_port}"
    return [
        pod_ip,
        env("CORRAL_HARNESS_ADDR", f"$({POD_IP_ENV}):{settings.harness_port}"),
        env("CORRAL_STATE_DIR", STATE_MOUNT),
        # The path as the tools container sees it; the harness never opens it itself.
        env("CORRAL_GRANTED_ROOT", facts.granted_root),
        env("CORRAL_EXEC_SOCKET", EXEC_SOCKET),
        env("CORRAL_WIRE_TOKEN_FILE", _WIRE_TOKEN_FILE),
        env("CORRAL_CUSTODIAN_URL", custodian_url),
        env("CORRAL_CUSTODIAN_CREDENTIAL_FILE", _CREDENTIAL_FILE),
        env("CORRAL_READ_ONLY", _flag(facts.read_only)),
        env("ANTHROPIC_BASE_URL", custodian_url),
        env("HOME", "/tmp"),
    ]


def harness_mounts() -> list[dict[str, Any]]:
    # No workspace: the harness reaches it only through the exec service's socket.
    return [
        mount("state", STATE_MOUNT),
        mount("harness-tmp", "/tmp"),
        mount("wire", WIRE_DIR, read_only=True),
        mount("exec-socket", EXEC_SOCKET_DIR),
    ]


def harness_container(
    settings: OperatorSettings,
    env_vars: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    security: dict[str, Any],
) -> dict[str, Any]:
    return {
        "name": "harness",
        "image": settings.image,
        "command": ["corral-harness"],
        "ports": [{"name": "wire", "containerPort": settings.harness_port, "protocol": "TCP"}],
        "env": env_vars,
        "workingDir": "/tmp",
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": settings.harness_port},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "volumeMounts": mounts,
        "resources": settings.resources.harness.wire(),
        "securityContext": dict(security),
    }


# --------------------------------------------------------------------------------- tools


def tools_container(
    image: str,
    granted_root: str,
    resources: dict[str, dict[str, str]],
    security: dict[str, Any],
    extra_env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "name": "tools",
        "image": image,
        "command": [EXEC_BINARY, "serve", "--socket", EXEC_SOCKET, "--root", granted_root],
        # No token, no Secret, no variable naming a control endpoint. The checkout belongs to
        # the tools uid but the volume's root to root (as the kubelet makes an emptyDir), so
        # git in the agent's own container would refuse the repository as "dubious".
        "env": [
            env("HOME", "/tmp"),
            env("GIT_CONFIG_COUNT", "1"),
            env("GIT_CONFIG_KEY_0", "safe.directory"),
            env("GIT_CONFIG_VALUE_0", "*"),
            # The egress gateway's address, without any credential (docs/egress.md).
            *(extra_env or []),
        ],
        "workingDir": granted_root,
        "volumeMounts": [
            mount("workspace", WORKSPACE_MOUNT),
            mount("exec-bin", EXEC_BIN_DIR, read_only=True),
            mount("exec-socket", EXEC_SOCKET_DIR),
            mount("tools-tmp", "/tmp"),
        ],
        "resources": resources,
        "securityContext": dict(security),
    }


# ----------------------------------------------------------------------------- custodian


def custodian_env(
    facts: SessionFacts,
    settings: OperatorSettings,
    pod_ip: dict[str, Any],
    budget_env: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    env_vars = [
        pod_ip,
        env("CORRAL_CUSTODIAN_ADDR", f"$({POD_IP_ENV}):{settings.custodian_port}"),
        env(
            "CORRAL_CUSTODIAN_OPERATOR_ADDR",
            f"$({POD_IP_ENV}):{settings.custodian_operator_port}",
        ),
        env("CORRAL_CUSTODIAN_CREDENTIAL_FILE", _CREDENTIAL_FILE),
        env("CORRAL_WIRE_TOKEN_FILE", _WIRE_TOKEN_FILE),
        env("CORRAL_UPSTREAM_URL", settings.model_upstream_url),
        env("CORRAL_SESSION_NAME", facts.name),
        env("CORRAL_SESSION_NAMESPACE", facts.namespace),
        env("CORRAL_SESSION_UID", facts.uid),
        env("CORRAL_AGENT_NAME", facts.agent_name),
        env("CORRAL_STATE_DIR", CUSTODIAN_STATE_MOUNT),
        env("CORRAL_AGENT_SPEC_JSON", facts.agent_spec_json),
        env("CORRAL_KUBE_API", settings.kube_api_url),
        env("CORRAL_KUBE_TOKEN_FILE", f"{KUBE_TOKEN_DIR}/token"),
        env("CORRAL_SESSION_BRANCH", facts.branch),
        env("CORRAL_GIT_REMOTE_URL", facts.repo),
        env("CORRAL_READ_ONLY", _flag(facts.read_only)),
        *budget_env,
        env("HOME", "/tmp"),
    ]
    if settings.kube_ca_configmap:
        env_vars.append(env("CORRAL_KUBE_CA_FILE", f"{KUBE_TOKEN_DIR}/ca.crt"))
    return env_vars


def custodian_mounts() -> list[dict[str, Any]]:
    # No workspace: the agent's commits reach the custodian as a bundle (docs/delivery.md),
    # so nothing the agent wrote is resolved by a process holding a credential.
    return [
        mount("custodian-state", CUSTODIAN_STATE_MOUNT),
        mount("custodian-tmp", "/tmp"),
        mount("wire", WIRE_DIR, read_only=True),
        mount("kube-token", KUBE_TOKEN_DIR, read_only=True),
    ]


def custodian_container(
    settings: OperatorSettings,
    env_vars: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    security: dict[str, Any],
) -> dict[str, Any]:
    return {
        "name": "custodian",
        "image": settings.image,
        "command": ["corral-custodian"],
        "ports": [
            {"name": "custodian", "containerPort": settings.custodian_port, "protocol": "TCP"},
            {
                "name": "custodian-op",
                "containerPort": settings.custodian_operator_port,
                "protocol": "TCP",
            },
        ],
        "env": env_vars,
        "workingDir": "/tmp",
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": settings.custodian_port},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "volumeMounts": mounts,
        "resources": settings.resources.custodian.wire(),
        "securityContext": dict(security),
    }
