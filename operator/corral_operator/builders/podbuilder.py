"""The sandbox pod builder: Agent + Session + operator settings -> the sandbox pod's manifests
(docs/architecture.md, "The sandbox pod: three roles, three uids").

A pure function with no Kubernetes import, so every security property is checked on plain
dicts in unit tests. Three roles, three containers, three uids (docs/decisions/0060):

- `harness` (the brain, uid 10001) runs the model's loop and records it. It holds the wire
  token and the pod-local credential it presents to the custodian, and nothing else: no
  workspace, no service-account token, no model key, no git secret. It reaches the workspace
  only through the exec service's Unix socket.
- `tools` (the hands, uid 10002) runs every working tool, files and commands, through the exec
  service (`corral-exec serve`). It mounts the workspace, its own /tmp, the exec binary
  (read-only) and the socket: no token, no state, no Secret, no variable naming an endpoint.
  `Agent.spec.sandbox.image` sets its image, and only its image.
- `custodian` (the keys, uid 10003) holds the model key, the git credentials and the pod's only
  service-account token (projected, audience-bound, short-lived). It answers the harness on one
  port (the credential) and the operator on another (the wire token; its usage record). It
  does not mount the workspace: the agent's commits reach it as a bundle the tools side writes.

Init containers copy the exec service onto a shared volume and clone the workspace (as the
tools uid, so the agent owns its files). The pod's fsGroup is shared: Secrets are kept from a
container by not mounting them, never by file modes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from corral_api import API_VERSION
from corral_api.kinds import Agent, Budget, EgressRule, Session, Usage
from corral_common.checkout import CHECKOUT_SCRIPT as CHECKOUT_SCRIPT  # evidencepod uses it

from .. import naming
from ..sandboxspec import (
    CheckedSandbox,
    SandboxSpecError,
    check_sandbox,
    granted_root_problem,
    is_relative_repo,
    quantity,
    resolve_repo,
    session_meta,
    tools_resources,
)
from ..settings import EgressTarget, OperatorSettings
from . import egress
from ._pod_containers import (
    SessionFacts,
    checkout_args,
    checkout_container,
    checkout_mounts,
    custodian_container,
    custodian_env,
    custodian_mounts,
    harness_container,
    harness_env,
    harness_mounts,
    install_exec_container,
    pod_ip_env,
    tools_container,
)
from ._pod_layout import (
    CUSTODIAN_CREDENTIAL_KEY,
    CUSTODIAN_STATE_MOUNT,
    EGRESS_CREDENTIAL_KEY,
    EXEC_BIN_DIR,
    EXEC_BINARY,
    EXEC_SOCKET,
    EXEC_SOCKET_DIR,
    GIT_CREDENTIALS_DIR,
    HOOK_SECRET_DIR,
    KUBE_TOKEN_DIR,
    MEMORY_DIR,
    MEMORY_DSN_KEY,
    MODEL_CATALOG_DIR,
    MODEL_CATALOG_KEY,
    MODEL_KEY_DIR,
    POD_IP_ENV,
    STATE_MOUNT,
    WIRE_DIR,
    WIRE_TOKEN_DIR,
    WIRE_TOKEN_KEY,
    WORKSPACE_MOUNT,
    env,
    kube_token_volume,
    scratch_and_wire_volumes,
)
from ._pod_options import pod_additions

# The pod's paths and keys are defined with its volumes (_pod_layout), the checks a sandbox
# passes in `sandboxspec`; import them from here.
__all__ = [
    "CHECKOUT_SCRIPT",
    "CUSTODIAN_CREDENTIAL_KEY",
    "CUSTODIAN_STATE_MOUNT",
    "EGRESS_CREDENTIAL_KEY",
    "EXEC_BINARY",
    "EXEC_BIN_DIR",
    "EXEC_SOCKET",
    "EXEC_SOCKET_DIR",
    "GIT_CREDENTIALS_DIR",
    "HOOK_SECRET_DIR",
    "KUBE_TOKEN_DIR",
    "MEMORY_DIR",
    "MEMORY_DSN_KEY",
    "MIN_SECRET_CHARS",
    "MODEL_CATALOG_DIR",
    "MODEL_CATALOG_KEY",
    "MODEL_KEY_DIR",
    "POD_IP_ENV",
    "STATE_MOUNT",
    "WIRE_DIR",
    "WIRE_TOKEN_DIR",
    "WIRE_TOKEN_KEY",
    "WORKSPACE_MOUNT",
    "SandboxManifests",
    "SandboxSpecError",
    "build_network_policy",
    "build_pod",
    "build_sandbox",
    "build_wire_secret",
    "granted_root_problem",
    "is_relative_repo",
    "owner_reference",
    "quantity",
    "resolve_repo",
    "restricted_security_context",
    "sandbox_labels",
    "tools_resources",
]

MIN_SECRET_CHARS = 32

# The checkout script is shared with a pooled pod's adopt (corral_common.checkout).


@dataclass(frozen=True)
class SandboxManifests:
    secret: dict[str, Any]
    network_policy: dict[str, Any]
    pod: dict[str, Any]

    def all(self) -> list[dict[str, Any]]:
        """In creation order: the pod mounts the secret, the policy should precede the pod."""
        return [self.secret, self.network_policy, self.pod]


def owner_reference(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def restricted_security_context(
    run_as_user: int, run_as_group: int | None = None
) -> dict[str, Any]:
    """What Pod Security `restricted` asks of every container, plus a read-only root."""
    return {
        "runAsNonRoot": True,
        "runAsUser": run_as_user,
        "runAsGroup": run_as_user if run_as_group is None else run_as_group,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_security_context(settings: OperatorSettings) -> dict[str, Any]:
    # No pod-wide uid: each container names its own. The fsGroup is the one group they share.
    return {
        "runAsNonRoot": True,
        "fsGroup": settings.fs_group,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def sandbox_labels(session: Session) -> dict[str, str]:
    name, _, _ = session_meta(session)
    parent = session.spec.parent_ref.name if session.spec.parent_ref else ""
    return {
        naming.LABEL_SESSION: naming.label_value(name),
        naming.LABEL_AGENT: naming.label_value(session.spec.agent_ref),
        naming.LABEL_PARENT: naming.label_value(parent),
        naming.LABEL_COMPONENT: "sandbox",
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    }


# ------------------------------------------------------------------------------ resources

# ---------------------------------------------------------------------------- the Secret


def build_wire_secret(
    session: Session,
    wire_token: str,
    custodian_credential: str,
    *,
    memory_dsn: str | None = None,
    egress_credential: str | None = None,
) -> dict[str, Any]:
    """The Session's own Secret: the wire token (operator <-> harness, operator <-> custodian)
    and the pod-local credential (harness -> custodian). Only harness and custodian mount it.
    With `memory_dsn` (the platform's memory database, copied from the operator's own Secret:
    a pod can mount only its namespace's Secrets) it also holds that, for the custodian alone;
    with `egress_credential`, the custodian's proxy credential (docs/egress.md), likewise."""
    name, namespace, uid = session_meta(session)
    if len(wire_token) < MIN_SECRET_CHARS:
        raise SandboxSpecError(f"the wire token must be at least {MIN_SECRET_CHARS} characters")
    if len(custodian_credential) < MIN_SECRET_CHARS:
        raise SandboxSpecError(
            f"the custodian credential must be at least {MIN_SECRET_CHARS} characters"
        )
    if custodian_credential == wire_token:
        raise SandboxSpecError("the custodian credential must differ from the wire token")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": naming.wire_secret_name(name),
            "namespace": namespace,
            "labels": sandbox_labels(session),
            "ownerReferences": [owner_reference("Session", name, uid)],
        },
        "type": "Opaque",
        "stringData": {
            WIRE_TOKEN_KEY: wire_token,
            CUSTODIAN_CREDENTIAL_KEY: custodian_credential,
            **({MEMORY_DSN_KEY: memory_dsn} if memory_dsn else {}),
            **({EGRESS_CREDENTIAL_KEY: egress_credential} if egress_credential else {}),
        },
    }


# --------------------------------------------------------------------- the NetworkPolicy


def build_network_policy(
    agent: Agent, session: Session, settings: OperatorSettings
) -> dict[str, Any]:
    """Ingress: the wire port and the custodian's operator port, from the operator's pods only.
    Egress: the egress gateway's proxy port alone, no DNS (docs/egress.md); the gateway tells
    the custodian's requests from the agent's by a credential only the custodian holds.
    """
    name, namespace, uid = session_meta(session)
    targets: list[EgressTarget | EgressRule] = [
        *settings.platform_egress,
        *agent.spec.sandbox.egress,
    ]
    policy_egress = egress.policy_egress(settings, targets)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": naming.network_policy_name(name),
            "namespace": namespace,
            "labels": sandbox_labels(session),
            "ownerReferences": [owner_reference("Session", name, uid)],
        },
        "spec": {
            "podSelector": {
                "matchLabels": {
                    naming.LABEL_SESSION: naming.label_value(name),
                    naming.LABEL_COMPONENT: "sandbox",
                }
            },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {
                                    "kubernetes.io/metadata.name": settings.operator_namespace
                                }
                            },
                            "podSelector": {"matchLabels": dict(settings.operator_pod_labels)},
                        }
                    ],
                    "ports": [
                        {"protocol": "TCP", "port": settings.harness_port},
                        {"protocol": "TCP", "port": settings.custodian_operator_port},
                    ],
                }
            ],
            "egress": policy_egress,
        },
    }


# --------------------------------------------------------------------------------- the pod


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed Session's new pod starts (docs/turns.md, "A lost pod"): the revision it
    last delivered (None: nothing was, so its starting ref) and what it had spent, which its
    custodian's record starts from."""

    revision: str | None
    usage: Usage
    # What the lost custodian had given its children (the sum of their spec.budget): it
    # counts against the Session in the new pod too, never from zero.
    carved_tokens: int = 0
    carved_cost: float = 0.0


def _usage_seed_env(resume: ResumePoint | None) -> list[dict[str, Any]]:
    if resume is None:
        return []
    u = resume.usage
    seed = {"input": u.input_tokens, "output": u.output_tokens, "cacheRead": u.cache_read_tokens,
            "cacheWrite": u.cache_write_tokens, "cost": u.cost}  # fmt: skip
    out = [env("CORRAL_USAGE_SEED", json.dumps(seed, sort_keys=True))]
    if resume.carved_tokens or resume.carved_cost:
        carved = {"tokens": resume.carved_tokens, "cost": resume.carved_cost}
        out.append(env("CORRAL_CARVED_SEED", json.dumps(carved, sort_keys=True)))
    return out


def carved_for(children: Iterable[dict[str, Any]]) -> tuple[int, float]:
    """What a Session's custodian gave its children: their spec.budget, summed (the custodian
    carves exactly that from its own when it creates one)."""
    tokens, cost = 0, 0.0
    for child in children:
        budget = ((child.get("spec") or {}).get("budget")) or {}
        tokens += int(budget.get("tokens") or 0)
        cost += float(budget.get("costUSD") or 0.0)
    return tokens, round(cost, 6)


def _budget_env(budget: Budget) -> list[dict[str, Any]]:
    """The custodian's budget (checked: no axis is spent); an axis without a cap is left unset
    (the custodian: no cap)."""
    budget_vars: list[dict[str, Any]] = []
    if budget.tokens is not None:
        budget_vars.append(env("CORRAL_BUDGET_TOKENS", str(budget.tokens)))
    if budget.cost_usd is not None:
        budget_vars.append(env("CORRAL_BUDGET_COST", repr(float(budget.cost_usd))))
    return budget_vars


def build_pod(
    agent: Agent,
    session: Session,
    settings: OperatorSettings,
    *,
    budget: Budget | None = None,
    egress_credential: str | None = None,
    resume: ResumePoint | None = None,
) -> dict[str, Any]:
    """The sandbox pod. `budget` is the Session's effective budget (the lowest of its own, its
    Agent's and, for a child, its parent's remainder); without it, the lower of the first two.
    `egress_credential` is the custodian's proxy credential, whose SHA-256 the pod's egress
    binding carries. SandboxSpecError when the Agent and the Session make no sandbox
    (`check_sandbox`)."""
    checked = check_sandbox(agent, session, settings, budget=budget)
    facts = _session_facts(agent, session, checked)
    if resume is not None and resume.revision:
        # The session branch's delivered revision, which the clone fetched with the branch.
        facts = dataclasses.replace(facts, ref=resume.revision)
    wire_secret = naming.wire_secret_name(facts.name)
    budget_env = [*_budget_env(checked.budget), *_usage_seed_env(resume)]
    tools_limits = checked.tools_resources
    added = pod_additions(agent.spec.credentials, settings, wire_secret, checked.provider)
    # One context per uid; a container that shares a uid gets its own copy of it.
    harness_security = restricted_security_context(settings.harness_uid)
    tools_security = restricted_security_context(settings.tools_uid)
    custodian_security = restricted_security_context(settings.custodian_uid)
    pod_ip = pod_ip_env()  # one entry, first in both the harness's and the custodian's env
    init_containers = [
        install_exec_container(settings, harness_security),
        checkout_container(
            settings,
            [*checkout_args(facts), *added.checkout_args],
            [*checkout_mounts(), *added.checkout_mounts],
            tools_security,
            added.checkout_env,
        ),
    ]
    containers = [
        harness_container(
            settings,
            [*harness_env(facts, settings, pod_ip), *added.harness_env],
            [*harness_mounts(), *added.harness_mounts],
            harness_security,
        ),
        tools_container(
            agent.spec.sandbox.image or settings.image,
            facts.granted_root,
            tools_limits,
            tools_security,
            added.tools_env,
        ),
        custodian_container(
            settings,
            [*custodian_env(facts, settings, pod_ip, budget_env), *added.custodian_env],
            [*custodian_mounts(), *added.custodian_mounts],
            custodian_security,
        ),
    ]
    volumes = [
        *scratch_and_wire_volumes(wire_secret, settings.volume_sizes),
        kube_token_volume(settings),
        *added.volumes,
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": naming.pod_name(facts.name),
            "namespace": facts.namespace,
            "labels": {**sandbox_labels(session), **egress.egress_labels(settings)},
            "annotations": _egress_binding(agent, facts, settings, egress_credential),
            "ownerReferences": [owner_reference("Session", facts.name, facts.uid)],
        },
        "spec": _pod_spec(agent, settings, init_containers, containers, volumes),
    }


def _egress_binding(
    agent: Agent, facts: SessionFacts, settings: OperatorSettings, credential: str | None
) -> dict[str, str]:
    """The gateway's binding of this pod: none without a gateway."""
    return session_binding(
        agent, facts.namespace, facts.name, facts.repo, settings, credential,
        pod=naming.pod_name(facts.name), agent_name=facts.agent_name,
    )  # fmt: skip


def session_binding(
    agent: Agent,
    namespace: str,
    session: str,
    repo: str | None,
    settings: OperatorSettings,
    credential: str | None,
    *,
    pod: str,
    agent_name: str,
    checkout: bool = False,
) -> dict[str, str]:
    """The annotations binding `pod` to Session `session` at the gateway (none without one).
    With `checkout`, the agent's identity may also reach the git host: a pooled pod's checkout
    runs in its tools container, without the custodian's credential, during its adoption
    (before any turn), and the adoption binds the pod again without it (docs/egress.md)."""
    if settings.egress_gateway is None:
        return {}
    return egress.binding(
        namespace=namespace,
        pod=pod,
        session=session,
        agent=agent_name,
        credential=credential,
        agent_rules=[egress.rule_of(r) for r in agent.spec.sandbox.egress],
        custodian=egress.custodian_rules(agent, repo, settings),
        checkout=egress.checkout_rules(repo) if checkout else (),
        key=settings.egress_gateway.binding_key,
    )


def _session_facts(agent: Agent, session: Session, checked: CheckedSandbox) -> SessionFacts:
    """The Session as its containers are told it, with what its check resolved."""
    spec = session.spec
    return SessionFacts(
        name=checked.name,
        namespace=checked.namespace,
        uid=checked.uid,
        agent_name=spec.agent_ref,
        agent_spec_json=json.dumps(agent.spec.wire(), sort_keys=True),
        repo=checked.repo,
        ref=spec.workspace.ref,
        branch=spec.workspace.branch or naming.session_branch(checked.name),
        granted_root=spec.workspace.granted_root,
        read_only=spec.read_only,
    )


def _pod_spec(
    agent: Agent,
    settings: OperatorSettings,
    init_containers: list[dict[str, Any]],
    containers: list[dict[str, Any]],
    volumes: list[dict[str, Any]],
) -> dict[str, Any]:
    """The pod-wide settings around its containers: no automounted token, no service links."""
    pod_spec: dict[str, Any] = {
        "serviceAccountName": settings.sandbox_service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Always",
        "securityContext": _pod_security_context(settings),
        "initContainers": init_containers,
        "containers": containers,
        "volumes": volumes,
        "terminationGracePeriodSeconds": 10,
    }
    if agent.spec.sandbox.runtime_class_name:
        pod_spec["runtimeClassName"] = agent.spec.sandbox.runtime_class_name
    return pod_spec


def build_sandbox(
    agent: Agent,
    session: Session,
    settings: OperatorSettings,
    wire_token: str,
    custodian_credential: str,
    *,
    budget: Budget | None = None,
    egress_credential: str | None = None,
    resume: ResumePoint | None = None,
) -> SandboxManifests:
    """Every manifest a Session owns. Raises SandboxSpecError on a spec that cannot work."""
    if settings.egress_gateway is None:
        egress_credential = None
    pod = build_pod(
        agent, session, settings, budget=budget, egress_credential=egress_credential,
        resume=resume,
    )  # fmt: skip
    return SandboxManifests(
        secret=build_wire_secret(
            session,
            wire_token,
            custodian_credential,
            memory_dsn=settings.memory_dsn,
            egress_credential=egress_credential,
        ),
        network_policy=build_network_policy(agent, session, settings),
        pod=pod,
    )
