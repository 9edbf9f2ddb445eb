"""The Evidence check pod and its NetworkPolicy: a fresh checkout at the revision and the
command, nothing else (docs/decisions/0033).

Never the agent's sandbox and never next to a credential: no service-account token (not
automounted, nothing projected), no secret volume, the restricted security context, requests
and limits on every container, sized emptyDirs, a deadline, and it runs once (restartPolicy
Never). Its NetworkPolicy, owned by the Evidence and selecting exactly its pod, denies all
ingress and allows egress only to the check's own `spec.egress` plus, for the checkout, the git
host (none when the repository is a local path). Pure functions over plain dicts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from corral_api.kinds import EgressRule, Evidence

from .. import naming
from ..naming import CHECK_CONTAINER as CHECK_CONTAINER
from ..sandboxspec import SandboxSpecError, is_relative_repo, resolve_repo
from ..settings import ContainerResources, EgressTarget, OperatorSettings
from . import egress as gateway
from .podbuilder import (
    CHECKOUT_SCRIPT,
    owner_reference,
    restricted_security_context,
)

CHECKOUT_CONTAINER = "checkout"
COMPONENT = "evidence"
_WORKSPACE = "/workspace"


class EvidenceSpecError(ValueError):
    """The Evidence cannot be run as specified (e.g. a repository a cluster cannot clone)."""


@dataclass(frozen=True)
class EvidenceSettings:
    """What an Evidence pod gets beyond its spec and the operator's settings; these defaults
    stand until the operator's command line carries them."""

    check_resources: ContainerResources = field(
        default_factory=lambda: ContainerResources("250m", "256Mi", "2", "2Gi")
    )
    checkout_resources: ContainerResources = field(
        default_factory=lambda: ContainerResources("100m", "128Mi", "1", "1Gi")
    )
    workspace_size: str = "2Gi"
    tmp_size: str = "512Mi"
    # A check that never ends is an Error, not a pod that lives forever.
    active_deadline_seconds: int = 1800
    # Where the checkout may clone from. None: the operator's platform egress, the destinations
    # every sandbox's own checkout already needs.
    git_egress: tuple[EgressTarget, ...] | None = None


@dataclass(frozen=True)
class EvidenceManifests:
    network_policy: dict[str, Any]
    pod: dict[str, Any]

    def all(self) -> list[dict[str, Any]]:
        """In creation order: the policy exists before the pod can send a packet."""
        return [self.network_policy, self.pod]


def _meta(evidence: Evidence) -> tuple[str, str, str]:
    md = evidence.metadata
    try:
        return str(md["name"]), str(md["namespace"]), str(md["uid"])
    except KeyError as missing:
        raise EvidenceSpecError(f"Evidence metadata lacks {missing.args[0]}") from None


def pod_labels(name: str) -> dict[str, str]:
    """The check pod's labels; the first two are exactly what its NetworkPolicy selects."""
    return {
        naming.LABEL_EVIDENCE: naming.label_value(name),
        naming.LABEL_COMPONENT: COMPONENT,
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    }


def is_local_repo(repo: str, local_repo_root: str | None = None) -> bool:
    """A path on the node (absolute, relative or file://): the checkout needs no network. A
    relative one under a local repo root that is a git server's URL is that server's."""
    if is_relative_repo(repo):
        return local_repo_root is None or "://" not in local_repo_root
    return repo.startswith("/") or repo.startswith("file:")


def checkout_repo(evidence: Evidence, settings: OperatorSettings) -> str:
    """The repository the checkout clones; EvidenceSpecError when a cluster cannot clone it."""
    repo = evidence.spec.repo
    if repo.startswith("-"):
        raise EvidenceSpecError(f"spec.repo {repo!r} must not start with '-'")
    try:
        return resolve_repo(repo, settings.local_repo_root)
    except SandboxSpecError as err:
        raise EvidenceSpecError(
            re.sub(r"(spec\.)?workspace\.repo", "spec.repo", str(err))
        ) from None


def build_evidence_pod(
    evidence: Evidence,
    settings: OperatorSettings,
    evidence_config: EvidenceSettings | None = None,
) -> dict[str, Any]:
    cfg = evidence_config or EvidenceSettings()
    name, namespace, uid = _meta(evidence)
    spec = evidence.spec
    image = spec.image or settings.image
    security = restricted_security_context(settings.run_as_user)
    mounts = [
        {"name": "workspace", "mountPath": _WORKSPACE},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    env = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "GIT_TERMINAL_PROMPT", "value": "0"},
        # The volume's root belongs to root (the kubelet makes it), the checkout to this uid:
        # git's ownership check is satisfied for the workspace alone, as command-line config.
        {"name": "GIT_CONFIG_COUNT", "value": "1"},
        {"name": "GIT_CONFIG_KEY_0", "value": "safe.directory"},
        {"name": "GIT_CONFIG_VALUE_0", "value": _WORKSPACE},
        # The egress gateway, with no credential: the check and its checkout are one identity.
        *gateway.proxy_env(gateway.proxy_url(settings)),
    ]
    if settings.egress_gateway is not None:
        env.append({"name": "GIT_PROXY_COMMAND", "value": gateway.GIT_PROXY_COMMAND})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": naming.evidence_pod_name(name),
            "namespace": namespace,
            "labels": {**pod_labels(name), **gateway.egress_labels(settings)},
            "annotations": _egress_binding(evidence, settings),
            "ownerReferences": [owner_reference("Evidence", name, uid)],
        },
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": cfg.active_deadline_seconds,
            "terminationGracePeriodSeconds": 10,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": settings.run_as_user,
                "runAsGroup": settings.run_as_user,
                "fsGroup": settings.run_as_user,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "initContainers": [
                {
                    "name": CHECKOUT_CONTAINER,
                    "image": image,
                    "command": ["sh"],
                    "args": [
                        "-c",
                        CHECKOUT_SCRIPT,
                        "checkout",
                        checkout_repo(evidence, settings),
                        spec.revision,
                        f"corral/evidence-{spec.check}",
                        _WORKSPACE,
                    ],
                    "env": env,
                    "volumeMounts": mounts,
                    "resources": cfg.checkout_resources.wire(),
                    "securityContext": dict(security),
                }
            ],
            "containers": [
                {
                    "name": CHECK_CONTAINER,
                    "image": image,
                    "command": ["sh", "-c", spec.command],
                    "workingDir": _WORKSPACE,
                    "env": env,
                    "volumeMounts": mounts,
                    "resources": cfg.check_resources.wire(),
                    "securityContext": dict(security),
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
            "volumes": [
                {"name": "workspace", "emptyDir": {"sizeLimit": cfg.workspace_size}},
                {"name": "tmp", "emptyDir": {"sizeLimit": cfg.tmp_size}},
            ],
        },
    }


def _egress_binding(evidence: Evidence, settings: OperatorSettings) -> dict[str, str]:
    """The gateway's binding: the check's rules and its git host, one identity, no credential."""
    if settings.egress_gateway is None:
        return {}
    name, namespace, _ = _meta(evidence)
    local = is_local_repo(evidence.spec.repo, settings.local_repo_root)
    repo = None if local else checkout_repo(evidence, settings)
    return gateway.binding(
        namespace=namespace,
        pod=naming.evidence_pod_name(name),
        session="",  # an Evidence is no Session: its records are the gateway's alone
        agent="",
        credential=None,
        agent_rules=[
            *(gateway.rule_of(r) for r in evidence.spec.egress),
            *gateway.checkout_rules(repo),
        ],
        key=settings.egress_gateway.binding_key,
    )


def build_evidence_network_policy(
    evidence: Evidence,
    settings: OperatorSettings,
    evidence_config: EvidenceSettings | None = None,
) -> dict[str, Any]:
    """Deny by default: no ingress at all; egress only to the egress gateway, which allows the
    check's rules and the git host for the checkout (docs/egress.md). Without a gateway, the
    check's CIDRs and the git egress alone (no DNS)."""
    cfg = evidence_config or EvidenceSettings()
    name, namespace, uid = _meta(evidence)
    targets: list[EgressTarget | EgressRule] = []
    if not is_local_repo(evidence.spec.repo, settings.local_repo_root):
        git = cfg.git_egress if cfg.git_egress is not None else settings.platform_egress
        targets.extend(git)
    targets.extend(evidence.spec.egress)
    # Without a gateway, DNS only when anything at all is allowed.
    egress = gateway.policy_egress(settings, targets, dns=bool(targets))
    selector = pod_labels(name)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": naming.evidence_pod_name(name),
            "namespace": namespace,
            "labels": dict(selector),
            "ownerReferences": [owner_reference("Evidence", name, uid)],
        },
        "spec": {
            "podSelector": {
                "matchLabels": {
                    naming.LABEL_EVIDENCE: selector[naming.LABEL_EVIDENCE],
                    naming.LABEL_COMPONENT: COMPONENT,
                }
            },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }


def build_evidence_manifests(
    evidence: Evidence,
    settings: OperatorSettings,
    evidence_config: EvidenceSettings | None = None,
) -> EvidenceManifests:
    """Both manifests, the policy first. Raises EvidenceSpecError when it cannot run."""
    cfg = evidence_config or EvidenceSettings()
    return EvidenceManifests(
        network_policy=build_evidence_network_policy(evidence, settings, cfg),
        pod=build_evidence_pod(evidence, settings, cfg),
    )
