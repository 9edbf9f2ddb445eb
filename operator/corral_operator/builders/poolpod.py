"""The warm pool's manifests: pooled sandbox pods, their one-time keys and their NetworkPolicy.

A pooled pod is the sandbox pod (docs/warm-pool.md) with every Session-bound thing taken out: no
checkout init container, no wire Secret volume, no Session identity, Agent spec, budget,
branch or remote in any environment. What remains is the Agent's (its image, resources,
runtime class, model key) and the operator's. Harness and custodian get only the SHA-256 of
their one-time key; the keys themselves live in a Secret no pod mounts and only the operator
reads (docs/warm-pool.md, ADR 0074). Pure: built from the cold pod so both share every security
property, checked on plain dicts in unit tests.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from corral_api import API_VERSION
from corral_api.kinds import Agent, Session, SessionSpec

from .. import naming
from ..naming import ANNOTATION_DIGEST as ANNOTATION_DIGEST
from ..naming import COMPONENT_POOL as COMPONENT_POOL
from ..naming import LABEL_POOL as LABEL_POOL
from ..sandboxspec import WORKSPACE_MOUNT
from ..settings import OperatorSettings
from .podbuilder import build_network_policy, build_pod

ADOPT_KEY_ENV = "CORRAL_ADOPT_KEY_SHA256"
HARNESS_KEY = "harness"
CUSTODIAN_KEY = "custodian"

# Set by the adopt instead: who the pod serves, what it enforces, where it checks out.
_SESSION_ENV = frozenset(
    {
        "CORRAL_WIRE_TOKEN_FILE",
        "CORRAL_CUSTODIAN_CREDENTIAL_FILE",
        "CORRAL_SESSION_NAME",
        "CORRAL_SESSION_NAMESPACE",
        "CORRAL_SESSION_UID",
        "CORRAL_AGENT_NAME",
        "CORRAL_AGENT_SPEC_JSON",
        "CORRAL_SESSION_BRANCH",
        "CORRAL_GIT_REMOTE_URL",
        "CORRAL_READ_ONLY",
        "CORRAL_BUDGET_TOKENS",
        "CORRAL_BUDGET_COST",
        "CORRAL_MODEL_OVERRIDE",
        "CORRAL_EGRESS_CREDENTIAL_FILE",
        "CORRAL_MEMORY_DSN_FILE",
    }
)
# Volumes of the Session's Secret: the wire's, the egress gateway's proxy credential and the
# memory database's DSN (the adopt hands the custodian both).
_SESSION_VOLUMES = frozenset({"wire", "egress", "memory"})
# Only for building the cold pod this one is derived from; never left in the result.
_PLACEHOLDER_UID = "00000000-pool-placeholder"
_PLACEHOLDER_REPO = "/pool-placeholder.git"


def agent_digest(agent: Agent, settings: OperatorSettings) -> str:
    """What a pooled pod was built from: the Agent's spec and the sandbox image. A pod whose
    digest differs is stale and is replaced."""
    basis = {"spec": agent.spec.wire(), "image": settings.image}
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:32]


def pool_labels(agent_name: str) -> dict[str, str]:
    return {
        LABEL_POOL: naming.label_value(agent_name),
        naming.LABEL_AGENT: naming.label_value(agent_name),
        naming.LABEL_COMPONENT: COMPONENT_POOL,
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    }


def _agent_owner(agent: Agent) -> dict[str, Any]:
    # Not blocking the Agent's deletion: that would need a right on agents/finalizers.
    md = agent.metadata
    return {
        "apiVersion": API_VERSION,
        "kind": "Agent",
        "name": str(md["name"]),
        "uid": str(md["uid"]),
        "controller": True,
    }


def key_secret_name(pod_name: str) -> str:
    return f"{pod_name}-adopt"


def pool_network_policy_name(agent_name: str) -> str:
    return naming.network_policy_name(f"warm-{agent_name}")


def _placeholder_session(agent: Agent) -> Session:
    spec = SessionSpec.model_validate(
        {
            "agentRef": agent.metadata["name"],
            "task": "warm pool",
            "workspace": {"repo": _PLACEHOLDER_REPO, "ref": "main"},
        }
    )
    metadata = {
        "name": "pool",
        "namespace": agent.metadata["namespace"],
        "uid": _PLACEHOLDER_UID,
    }
    return Session(metadata=metadata, spec=spec)


@dataclass(frozen=True)
class PoolPodManifests:
    pod: dict[str, Any]
    harness_key: str
    custodian_key: str

    def key_secret(self, pod_uid: str) -> dict[str, Any]:
        """The Secret holding the pod's keys, owned by the pod (made once the pod exists), so
        it goes with the pod and the operator never needs to delete Secrets. No pod mounts it;
        a pod is adoptable only once it exists."""
        md = self.pod["metadata"]
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": key_secret_name(md["name"]),
                "namespace": md["namespace"],
                "labels": dict(md["labels"]),
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": md["name"], "uid": pod_uid}
                ],
            },
            "type": "Opaque",
            "stringData": {HARNESS_KEY: self.harness_key, CUSTODIAN_KEY: self.custodian_key},
        }


def build_pool_pod(
    agent: Agent,
    settings: OperatorSettings,
    pod_name: str,
    harness_key: str,
    custodian_key: str,
) -> PoolPodManifests:
    """A pooled pod for `agent`; its pod spec holds only the digests of the two keys."""
    namespace = str(agent.metadata["namespace"])
    cold = build_pod(agent, _placeholder_session(agent), settings)
    pod = copy.deepcopy(cold)
    spec = pod["spec"]
    spec["initContainers"] = [c for c in spec["initContainers"] if c["name"] != "checkout"]
    # The checkout's HOME goes with it (an adopt's checkout runs in the tools container).
    spec["volumes"] = [
        v for v in spec["volumes"] if v["name"] not in (*_SESSION_VOLUMES, "checkout-home")
    ]
    digests = {
        "harness": hashlib.sha256(harness_key.encode()).hexdigest(),
        "custodian": hashlib.sha256(custodian_key.encode()).hexdigest(),
    }
    for container in spec["containers"]:
        container["volumeMounts"] = [
            m for m in container["volumeMounts"] if m["name"] not in _SESSION_VOLUMES
        ]
        if container["name"] in digests:
            env = [e for e in container.get("env", []) if e["name"] not in _SESSION_ENV]
            if container["name"] == "harness":
                # A pooled pod serves the default granted root only (the exec service's root is
                # fixed when the tools container starts); other Sessions get cold pods.
                env = [
                    {"name": e["name"], "value": WORKSPACE_MOUNT}
                    if e["name"] == "CORRAL_GRANTED_ROOT"
                    else e
                    for e in env
                ]
            env.append({"name": ADOPT_KEY_ENV, "value": digests[container["name"]]})
            container["env"] = env
    pod["metadata"] = {
        "name": pod_name,
        "namespace": namespace,
        "labels": pool_labels(str(agent.metadata["name"])),
        "annotations": {ANNOTATION_DIGEST: agent_digest(agent, settings)},
        "ownerReferences": [_agent_owner(agent)],
    }
    text = json.dumps(pod)
    if _PLACEHOLDER_UID in text or _PLACEHOLDER_REPO in text:
        raise ValueError("a Session-bound value was left in the pooled pod")
    return PoolPodManifests(pod=pod, harness_key=harness_key, custodian_key=custodian_key)


def build_pool_network_policy(agent: Agent, settings: OperatorSettings) -> dict[str, Any]:
    """Until adopted a pooled pod talks to no one and hears only the operator, on the wire
    port and the custodian's operator port. Adoption relabels the pod out of this policy and
    into its Session's."""
    name = str(agent.metadata["name"])
    cold = build_network_policy(agent, _placeholder_session(agent), settings)
    policy = {
        "apiVersion": cold["apiVersion"],
        "kind": cold["kind"],
        "metadata": {
            "name": pool_network_policy_name(name),
            "namespace": str(agent.metadata["namespace"]),
            "labels": pool_labels(name),
            "ownerReferences": [_agent_owner(agent)],
        },
        "spec": {
            "podSelector": {
                "matchLabels": {
                    LABEL_POOL: naming.label_value(name),
                    naming.LABEL_COMPONENT: COMPONENT_POOL,
                }
            },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": cold["spec"]["ingress"],
            "egress": [],
        },
    }
    return policy
