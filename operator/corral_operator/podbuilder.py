"""The sandbox pod builder: Agent + Session + operator settings -> the manifests of DESIGN §3.

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

import json
import posixpath
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from corral_api import API_VERSION
from corral_api.kinds import Agent, Budget, EgressRule, Session
from corral_common.checkout import CHECKOUT_GIT_ENV
from corral_common.checkout import CHECKOUT_SCRIPT as CHECKOUT_SCRIPT  # evidencepod uses it
from corral_common.logs import LOG_FORMAT_ENV

from . import naming
from .planning.lineage import lowest
from .settings import ContainerResources, EgressTarget, OperatorSettings

WORKSPACE_MOUNT = "/workspace"
STATE_MOUNT = "/var/lib/corral/state"
CUSTODIAN_STATE_MOUNT = "/var/lib/corral/custodian"
WIRE_DIR = "/var/run/corral/wire"
WIRE_TOKEN_DIR = WIRE_DIR  # the name earlier callers know
MODEL_KEY_DIR = "/var/run/corral/model"
GIT_CREDENTIALS_DIR = "/var/run/corral/git"
HOOK_SECRET_DIR = "/var/run/corral/hooks"  # credentials.hookSecretRef: http hooks' headers
MEMORY_DIR = "/var/run/corral/memory"  # the memory store's DSN, for the custodian alone
MEMORY_DSN_KEY = "memory-dsn"
KUBE_TOKEN_DIR = "/var/run/corral/kube"
EXEC_BIN_DIR = "/opt/corral-exec"
EXEC_BINARY = f"{EXEC_BIN_DIR}/corral-exec"
EXEC_SOCKET_DIR = "/var/run/corral/exec"
EXEC_SOCKET = f"{EXEC_SOCKET_DIR}/exec.sock"
WIRE_TOKEN_KEY = "token"
CUSTODIAN_CREDENTIAL_KEY = "custodian"
POD_IP_ENV = "CORRAL_POD_IP"
MODEL_CATALOG_DIR = "/etc/corral/catalog"
MODEL_CATALOG_KEY = "models.json"
MIN_SECRET_CHARS = 32

# The checkout script is shared with a pooled pod's adopt (corral_common.checkout).


class SandboxSpecError(ValueError):
    """The Agent and Session together cannot make a valid sandbox; the message says why."""


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


def _meta(session: Session) -> tuple[str, str, str]:
    md = session.metadata
    try:
        return str(md["name"]), str(md["namespace"]), str(md["uid"])
    except KeyError as missing:
        raise SandboxSpecError(f"Session metadata lacks {missing.args[0]}") from None


def sandbox_labels(session: Session) -> dict[str, str]:
    name, _, _ = _meta(session)
    parent = session.spec.parent_ref.name if session.spec.parent_ref else ""
    return {
        naming.LABEL_SESSION: naming.label_value(name),
        naming.LABEL_AGENT: naming.label_value(session.spec.agent_ref),
        naming.LABEL_PARENT: naming.label_value(parent),
        naming.LABEL_COMPONENT: "sandbox",
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    }


def granted_root_problem(granted_root: str) -> str | None:
    """Why `granted_root` cannot be the agent's root (the API server's CEL rule, again), or None.

    The workspace volume is always mounted at /workspace, so the root is /workspace or below:
    anything else would hand the agent the image's own files (e.g. /opt/corral/bin).
    """
    inside = granted_root == WORKSPACE_MOUNT or granted_root.startswith(WORKSPACE_MOUNT + "/")
    parts = granted_root.split("/")
    if not inside or ".." in parts or "." in parts or "//" in granted_root:
        return (
            f"spec.workspace.grantedRoot {granted_root!r} must be /workspace or a path below it, "
            "without '.', '..' or '//' (the workspace volume is always mounted at /workspace)"
        )
    if any(c in granted_root for c in "\0\n\r"):
        return f"spec.workspace.grantedRoot {granted_root!r} holds a control character"
    return None


def _validate(agent: Agent, session: Session) -> None:
    ws = session.spec.workspace
    if ws.ref.startswith("-"):
        raise SandboxSpecError(f"spec.workspace.ref {ws.ref!r} must not start with '-'")
    if ws.repo.startswith("-"):
        raise SandboxSpecError(f"spec.workspace.repo {ws.repo!r} must not start with '-'")
    if any(c in ws.ref for c in " \t\n\\~^:?*["):
        raise SandboxSpecError(f"spec.workspace.ref {ws.ref!r} is not a valid git ref")
    problem = granted_root_problem(ws.granted_root)
    if problem is not None:
        raise SandboxSpecError(problem)
    if session.spec.agent_ref != agent.metadata.get("name"):
        raise SandboxSpecError(
            f"Session names Agent {session.spec.agent_ref!r}, given {agent.metadata.get('name')!r}"
        )


def is_relative_repo(repo: str) -> bool:
    """A relative path, as git would read `repo`: not absolute, not a URL, not `host:path`."""
    if repo.startswith("/") or "://" in repo:
        return False
    colon, slash = repo.find(":"), repo.find("/")
    scp_like = colon > 0 and (slash < 0 or colon < slash)  # git@host:org/repo, host:repo
    return not scp_like


def resolve_repo(repo: str, local_repo_root: str | None) -> str:
    """The repository the checkout clones: `repo` itself, or a relative one under the root.

    A relative `workspace.repo` (what `corral run` resolves against the YAML's directory) means
    nothing to a cluster, so it is refused unless the operator runs with a local repo root, a
    development aid for local clusters. The check is lexical (no I/O here): after
    normalisation the path must stay strictly inside the root, so `..` cannot leave it.
    """
    if not is_relative_repo(repo):
        return repo
    if local_repo_root is None:
        raise SandboxSpecError(
            f"workspace.repo {repo!r} is a relative path, which a cluster cannot clone; give a "
            "git URL or an absolute path (relative paths work only with an operator started "
            "with --local-repo-root, a development aid for local clusters)"
        )
    root = posixpath.normpath(local_repo_root)
    if not posixpath.isabs(root):
        raise SandboxSpecError(f"the local repo root {local_repo_root!r} is not absolute")
    resolved = posixpath.normpath(posixpath.join(root, repo))
    if not resolved.startswith(root.rstrip("/") + "/"):
        raise SandboxSpecError(
            f"workspace.repo {repo!r} is not inside the local repo root {local_repo_root!r}"
        )
    return resolved


# ------------------------------------------------------------------------------ resources

_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$"
)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def quantity(text: str, where: str) -> Decimal:
    """A Kubernetes quantity (`500m`, `1Gi`, `2e3`) as a number; SandboxSpecError otherwise."""
    match = _QUANTITY.match(text.strip())
    if not match:
        raise SandboxSpecError(f"{where} {text!r} is not a Kubernetes quantity (e.g. 500m, 1Gi)")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number + suffix)
        return Decimal(number) * _SUFFIX[suffix]
    except InvalidOperation:
        raise SandboxSpecError(f"{where} {text!r} is not a Kubernetes quantity") from None


def tools_resources(agent: Agent, defaults: ContainerResources) -> dict[str, dict[str, str]]:
    """The tools container's requests and limits: the Agent's where it sets them, else the
    defaults, so both are always there. A default limit below the Agent's request rises to it;
    an Agent's own limit below its own request is refused."""
    base = defaults.wire()
    requests, limits = dict(base["requests"]), dict(base["limits"])
    own_limits: set[str] = set()
    res = agent.spec.sandbox.resources
    if res is not None:
        requests.update(res.requests.wire() if res.requests else {})
        own = res.limits.wire() if res.limits else {}
        limits.update(own)
        own_limits.update(own)
    for key in sorted(set(requests) | set(limits)):
        where = "spec.sandbox.resources"
        wanted = quantity(requests[key], f"{where}.requests.{key}") if key in requests else None
        cap = quantity(limits[key], f"{where}.limits.{key}") if key in limits else None
        if wanted is None or cap is None or wanted <= cap:
            continue
        if key in own_limits:
            raise SandboxSpecError(
                f"{where}.requests.{key} {requests[key]!r} is above "
                f"{where}.limits.{key} {limits[key]!r}"
            )
        limits[key] = requests[key]
    return {"requests": requests, "limits": limits}


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


# ---------------------------------------------------------------------------- the Secret


def build_wire_secret(
    session: Session,
    wire_token: str,
    custodian_credential: str,
    *,
    memory_dsn: str | None = None,
) -> dict[str, Any]:
    """The Session's own Secret: the wire token (operator <-> harness, operator <-> custodian)
    and the pod-local credential (harness -> custodian). Only harness and custodian mount it.
    With `memory_dsn` (the platform's memory database, copied from the operator's own Secret:
    a pod can mount only its namespace's Secrets) it also holds that, for the custodian alone."""
    name, namespace, uid = _meta(session)
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
        },
    }


# --------------------------------------------------------------------- the NetworkPolicy


def _egress_rule(cidr: str, ports: tuple[int, ...] | list[int]) -> dict[str, Any]:
    rule: dict[str, Any] = {"to": [{"ipBlock": {"cidr": cidr}}]}
    if ports:
        rule["ports"] = [{"protocol": "TCP", "port": p} for p in ports]
    return rule


def build_network_policy(
    agent: Agent, session: Session, settings: OperatorSettings
) -> dict[str, Any]:
    """Ingress: the wire port and the custodian's operator port, from the operator's pods only.
    Egress: DNS to the cluster's DNS pods only, and what is allowed, no more.

    A NetworkPolicy selects pods, not containers, so the platform egress (API server, model
    endpoint) is open to the pod; the harness and the tools hold nothing those endpoints accept.
    """
    name, namespace, uid = _meta(session)
    egress: list[dict[str, Any]] = []
    if settings.allow_dns:
        egress.append(
            {
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": settings.dns_namespace}
                        },
                        "podSelector": {"matchLabels": dict(settings.dns_pod_labels)},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            }
        )
    targets: list[EgressTarget | EgressRule] = [
        *settings.platform_egress,
        *agent.spec.sandbox.egress,
    ]
    for target in targets:
        egress.append(_egress_rule(target.cidr, tuple(target.ports)))
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
            "egress": egress,
        },
    }


# --------------------------------------------------------------------------------- the pod


def _empty_dir(name: str, size: str, *, memory: bool = False) -> dict[str, Any]:
    source: dict[str, Any] = {"sizeLimit": size}
    if memory:
        source["medium"] = "Memory"
    return {"name": name, "emptyDir": source}


def _mount(name: str, path: str, *, read_only: bool = False) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": name, "mountPath": path}
    if read_only:
        mount["readOnly"] = True
    return mount


def _budget_env(budget: Budget) -> list[dict[str, Any]]:
    """The custodian's budget; an axis without a cap is left unset (the custodian: no cap)."""
    env: list[dict[str, Any]] = []
    if budget.tokens is not None:
        if budget.tokens < 1:
            raise SandboxSpecError("the Session's token budget is spent before it starts")
        env.append(_env("CORRAL_BUDGET_TOKENS", str(budget.tokens)))
    if budget.cost_usd is not None:
        if budget.cost_usd <= 0:
            raise SandboxSpecError("the Session's cost budget is spent before it starts")
        env.append(_env("CORRAL_BUDGET_COST", repr(float(budget.cost_usd))))
    return env


def build_pod(
    agent: Agent,
    session: Session,
    settings: OperatorSettings,
    *,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """The sandbox pod. `budget` is the Session's effective budget (the lowest of its own, its
    Agent's and, for a child, its parent's remainder); without it, the lower of the first two."""
    _validate(agent, session)
    name, namespace, uid = _meta(session)
    spec = session.spec
    creds = agent.spec.credentials
    sizes = settings.volume_sizes
    defaults = settings.resources
    granted_root = spec.workspace.granted_root
    repo = resolve_repo(spec.workspace.repo, settings.local_repo_root)
    branch = spec.workspace.branch or naming.session_branch(name)
    effective = budget if budget is not None else lowest(spec.budget, agent.spec.limits.budget)
    harness_security = restricted_security_context(settings.harness_uid)
    tools_security = restricted_security_context(settings.tools_uid)
    custodian_security = restricted_security_context(settings.custodian_uid)
    custodian_url = f"http://$({POD_IP_ENV}):{settings.custodian_port}"
    pod_ip_env = {
        "name": POD_IP_ENV,
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
    }
    wire_token_file = f"{WIRE_DIR}/{WIRE_TOKEN_KEY}"
    credential_file = f"{WIRE_DIR}/{CUSTODIAN_CREDENTIAL_KEY}"

    volumes: list[dict[str, Any]] = [
        _empty_dir("workspace", sizes.workspace),
        _empty_dir("state", sizes.state),
        _empty_dir("harness-tmp", sizes.tmp),
        _empty_dir("tools-tmp", sizes.tmp),
        # The checkout's own HOME and /tmp: never the agent's, which a re-run would trust.
        _empty_dir("checkout-home", sizes.tmp),
        _empty_dir("custodian-state", sizes.state),
        _empty_dir("custodian-tmp", sizes.tmp),
        _empty_dir("exec-bin", sizes.exec_bin),
        _empty_dir("exec-socket", sizes.exec_socket, memory=True),
        {
            "name": "wire",
            "secret": {
                "secretName": naming.wire_secret_name(name),
                "defaultMode": 0o440,
                "items": [
                    {"key": WIRE_TOKEN_KEY, "path": WIRE_TOKEN_KEY},
                    {"key": CUSTODIAN_CREDENTIAL_KEY, "path": CUSTODIAN_CREDENTIAL_KEY},
                ],
            },
        },
    ]
    kube_sources: list[dict[str, Any]] = [
        {
            "serviceAccountToken": {
                "audience": settings.token_audience,
                "expirationSeconds": settings.token_expiry_seconds,
                "path": "token",
            }
        }
    ]
    if settings.kube_ca_configmap:
        kube_sources.append(
            {
                "configMap": {
                    "name": settings.kube_ca_configmap,
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            }
        )
    volumes.append(
        {"name": "kube-token", "projected": {"defaultMode": 0o440, "sources": kube_sources}}
    )

    # --- init 1: the exec service onto its volume, from Corral's image.
    install_exec = {
        "name": "install-exec",
        "image": settings.image,
        "command": ["corral-exec", "install", EXEC_BIN_DIR],
        "volumeMounts": [_mount("exec-bin", EXEC_BIN_DIR)],
        "resources": defaults.install_exec.wire(),
        "securityContext": dict(harness_security),
    }

    # --- init 2: the checkout, as the tools uid, with git credentials when the Agent has them.
    # It runs again in this pod after a node or runtime restart, when the agent has had the
    # workspace and its /tmp: its HOME and /tmp are a volume no other container mounts, and the
    # script reads no git configuration but its command line's (corral_common.checkout).
    checkout_mounts: list[dict[str, Any]] = [
        _mount("workspace", WORKSPACE_MOUNT),
        _mount("checkout-home", "/tmp"),
    ]
    checkout_args = [
        "-c",
        CHECKOUT_SCRIPT,
        "checkout",
        repo,
        spec.workspace.ref,
        branch,  # the session branch itself, which the checkout refuses when the ref names it
        WORKSPACE_MOUNT,
    ]
    # No workspace: the agent's commits reach the custodian as a bundle (docs/delivery.md),
    # so nothing the agent wrote is resolved by a process holding a credential.
    custodian_mounts: list[dict[str, Any]] = [
        _mount("custodian-state", CUSTODIAN_STATE_MOUNT),
        _mount("custodian-tmp", "/tmp"),
        _mount("wire", WIRE_DIR, read_only=True),
        _mount("kube-token", KUBE_TOKEN_DIR, read_only=True),
    ]
    custodian_env: list[dict[str, Any]] = [
        pod_ip_env,
        _env("CORRAL_CUSTODIAN_ADDR", f"$({POD_IP_ENV}):{settings.custodian_port}"),
        _env(
            "CORRAL_CUSTODIAN_OPERATOR_ADDR",
            f"$({POD_IP_ENV}):{settings.custodian_operator_port}",
        ),
        _env("CORRAL_CUSTODIAN_CREDENTIAL_FILE", credential_file),
        _env("CORRAL_WIRE_TOKEN_FILE", wire_token_file),
        _env("CORRAL_UPSTREAM_URL", settings.model_upstream_url),
        _env("CORRAL_SESSION_NAME", name),
        _env("CORRAL_SESSION_NAMESPACE", namespace),
        _env("CORRAL_SESSION_UID", uid),
        _env("CORRAL_AGENT_NAME", spec.agent_ref),
        _env("CORRAL_STATE_DIR", CUSTODIAN_STATE_MOUNT),
        _env("CORRAL_AGENT_SPEC_JSON", json.dumps(agent.spec.wire(), sort_keys=True)),
        _env("CORRAL_KUBE_API", settings.kube_api_url),
        _env("CORRAL_KUBE_TOKEN_FILE", f"{KUBE_TOKEN_DIR}/token"),
        _env("CORRAL_SESSION_BRANCH", branch),
        _env("CORRAL_GIT_REMOTE_URL", repo),
        _env("CORRAL_READ_ONLY", "true" if spec.read_only else "false"),
        *_budget_env(effective),
        _env("HOME", "/tmp"),
    ]
    if settings.kube_ca_configmap:
        custodian_env.append(_env("CORRAL_KUBE_CA_FILE", f"{KUBE_TOKEN_DIR}/ca.crt"))
    if creds.model_secret_ref:
        volumes.append(
            {
                "name": "model-key",
                "secret": {
                    "secretName": creds.model_secret_ref.name,
                    "defaultMode": 0o440,
                    "items": [{"key": creds.model_secret_ref.key, "path": "key"}],
                },
            }
        )
        custodian_mounts.append(_mount("model-key", MODEL_KEY_DIR, read_only=True))
        custodian_env.append(_env("CORRAL_MODEL_KEY_FILE", f"{MODEL_KEY_DIR}/key"))
    if creds.git_secret_ref:
        volumes.append(
            {
                "name": "git-credentials",
                "secret": {
                    "secretName": creds.git_secret_ref.name,
                    "defaultMode": 0o440,
                    "items": [{"key": creds.git_secret_ref.key, "path": "credentials"}],
                },
            }
        )
        git_mount = _mount("git-credentials", GIT_CREDENTIALS_DIR, read_only=True)
        custodian_mounts.append(git_mount)
        checkout_mounts.append(dict(git_mount))
        custodian_env.append(
            _env("CORRAL_GIT_CREDENTIALS_FILE", f"{GIT_CREDENTIALS_DIR}/credentials")
        )
        checkout_args.append(f"{GIT_CREDENTIALS_DIR}/credentials")
    if creds.hook_secret_ref:
        # Every key, for the custodian alone: it adds them to http hooks' requests.
        volumes.append(
            {
                "name": "hook-secret",
                "secret": {"secretName": creds.hook_secret_ref.name, "defaultMode": 0o440},
            }
        )
        custodian_mounts.append(_mount("hook-secret", HOOK_SECRET_DIR, read_only=True))
        custodian_env.append(_env("CORRAL_HOOK_SECRET_DIR", HOOK_SECRET_DIR))
    if settings.memory_dsn:
        # Long-term memory (docs/memory.md): the DSN's one item of the Session's Secret, in
        # the custodian only; the harness's view of that Secret lists its two keys alone.
        volumes.append(
            {
                "name": "memory",
                "secret": {
                    "secretName": naming.wire_secret_name(name),
                    "defaultMode": 0o440,
                    "items": [{"key": MEMORY_DSN_KEY, "path": "dsn"}],
                },
            }
        )
        custodian_mounts.append(_mount("memory", MEMORY_DIR, read_only=True))
        custodian_env.append(_env("CORRAL_MEMORY_DSN_FILE", f"{MEMORY_DIR}/dsn"))
    checkout = {
        "name": "checkout",
        "image": settings.image,
        "command": ["sh"],
        "args": checkout_args,
        "env": [_env("HOME", "/tmp"), *(_env(k, v) for k, v in CHECKOUT_GIT_ENV)],
        "volumeMounts": checkout_mounts,
        "resources": defaults.checkout.wire(),
        "securityContext": dict(tools_security),
    }

    harness_env = [
        pod_ip_env,
        _env("CORRAL_HARNESS_ADDR", f"$({POD_IP_ENV}):{settings.harness_port}"),
        _env("CORRAL_STATE_DIR", STATE_MOUNT),
        # The path as the tools container sees it; the harness never opens it itself.
        _env("CORRAL_GRANTED_ROOT", granted_root),
        _env("CORRAL_EXEC_SOCKET", EXEC_SOCKET),
        _env("CORRAL_WIRE_TOKEN_FILE", wire_token_file),
        _env("CORRAL_CUSTODIAN_URL", custodian_url),
        _env("CORRAL_CUSTODIAN_CREDENTIAL_FILE", credential_file),
        _env("CORRAL_READ_ONLY", "true" if spec.read_only else "false"),
        _env("ANTHROPIC_BASE_URL", custodian_url),
        _env("HOME", "/tmp"),
    ]
    if settings.log_format != "text":
        # The harness and the custodian log as the operator does (docs/observability.md).
        for env in (harness_env, custodian_env):
            env.append(_env(LOG_FORMAT_ENV, settings.log_format))
    if settings.otlp_endpoint:
        # Traces of each run leave over OTLP (docs/tracing.md); unset, the SDK is not loaded.
        harness_env += [
            _env("OTEL_EXPORTER_OTLP_ENDPOINT", settings.otlp_endpoint),
            _env("OTEL_SERVICE_NAME", "corral-harness"),
        ]
    harness_mounts: list[dict[str, Any]] = [
        _mount("state", STATE_MOUNT),
        _mount("harness-tmp", "/tmp"),
        _mount("wire", WIRE_DIR, read_only=True),
        _mount("exec-socket", EXEC_SOCKET_DIR),
    ]
    harness = {
        "name": "harness",
        "image": settings.image,
        "command": ["corral-harness"],
        "ports": [{"name": "wire", "containerPort": settings.harness_port, "protocol": "TCP"}],
        "env": harness_env,
        "workingDir": "/tmp",
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": settings.harness_port},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "volumeMounts": harness_mounts,
        "resources": defaults.harness.wire(),
        "securityContext": dict(harness_security),
    }
    tools = {
        "name": "tools",
        "image": agent.spec.sandbox.image or settings.image,
        "command": [EXEC_BINARY, "serve", "--socket", EXEC_SOCKET, "--root", granted_root],
        # No token, no Secret, no variable naming a control endpoint. The checkout belongs to
        # the tools uid but the volume's root to root (as the kubelet makes an emptyDir), so
        # git in the agent's own container would refuse the repository as "dubious".
        "env": [
            _env("HOME", "/tmp"),
            _env("GIT_CONFIG_COUNT", "1"),
            _env("GIT_CONFIG_KEY_0", "safe.directory"),
            _env("GIT_CONFIG_VALUE_0", "*"),
        ],
        "workingDir": granted_root,
        "volumeMounts": [
            _mount("workspace", WORKSPACE_MOUNT),
            _mount("exec-bin", EXEC_BIN_DIR, read_only=True),
            _mount("exec-socket", EXEC_SOCKET_DIR),
            _mount("tools-tmp", "/tmp"),
        ],
        "resources": tools_resources(agent, defaults.tools),
        "securityContext": dict(tools_security),
    }
    custodian = {
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
        "env": custodian_env,
        "workingDir": "/tmp",
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": settings.custodian_port},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "volumeMounts": custodian_mounts,
        "resources": defaults.custodian.wire(),
        "securityContext": dict(custodian_security),
    }
    if settings.model_catalog_configmap:
        # The platform's catalog overlay: the harness resolves models and the custodian
        # allowlists and clamps them from the same file (docs/model-catalog.md).
        volumes.append(
            {
                "name": "model-catalog",
                "configMap": {
                    "name": settings.model_catalog_configmap,
                    "defaultMode": 0o444,
                    "items": [{"key": MODEL_CATALOG_KEY, "path": MODEL_CATALOG_KEY}],
                },
            }
        )
        catalog_env = _env("CORRAL_MODEL_CATALOG", f"{MODEL_CATALOG_DIR}/{MODEL_CATALOG_KEY}")
        catalog_mount = _mount("model-catalog", MODEL_CATALOG_DIR, read_only=True)
        harness_env.append(catalog_env)
        custodian_env.append(dict(catalog_env))
        harness_mounts.append(catalog_mount)
        custodian_mounts.append(dict(catalog_mount))
    pod_spec: dict[str, Any] = {
        "serviceAccountName": settings.sandbox_service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Always",
        "securityContext": _pod_security_context(settings),
        "initContainers": [install_exec, checkout],
        "containers": [harness, tools, custodian],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 10,
    }
    if agent.spec.sandbox.runtime_class_name:
        pod_spec["runtimeClassName"] = agent.spec.sandbox.runtime_class_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": naming.pod_name(name),
            "namespace": namespace,
            "labels": sandbox_labels(session),
            "ownerReferences": [owner_reference("Session", name, uid)],
        },
        "spec": pod_spec,
    }


def build_sandbox(
    agent: Agent,
    session: Session,
    settings: OperatorSettings,
    wire_token: str,
    custodian_credential: str,
    *,
    budget: Budget | None = None,
) -> SandboxManifests:
    """Every manifest a Session owns. Raises SandboxSpecError on a spec that cannot work."""
    pod = build_pod(agent, session, settings, budget=budget)
    return SandboxManifests(
        secret=build_wire_secret(
            session, wire_token, custodian_credential, memory_dsn=settings.memory_dsn
        ),
        network_policy=build_network_policy(agent, session, settings),
        pod=pod,
    )
