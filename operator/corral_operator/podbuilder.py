"""The sandbox pod builder: Agent + Session + operator settings -> the manifests of DESIGN §3.

A pure function with no Kubernetes import, so every security property is checked on plain
dicts in unit tests. The credential split is the point of this module:

- `harness` runs the model's tools, so it gets no service-account token, no model key and no
  git secret, in env or files. It holds only the wire token, which opens nothing but its own
  wire (docs/decisions/0030).
- `custodian` holds the model key, the git credentials and the pod's only service-account
  token (projected, audience-bound, short-lived).
- the init container clones the workspace with the git credentials and then exits.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

from corral_api import API_VERSION
from corral_api.kinds import Agent, EgressRule, Session

from . import naming
from .settings import EgressTarget, OperatorSettings

WORKSPACE_MOUNT = "/workspace"
STATE_MOUNT = "/var/lib/corral/state"
CUSTODIAN_STATE_MOUNT = "/var/lib/corral/custodian"
WIRE_TOKEN_DIR = "/var/run/corral/wire"
MODEL_KEY_DIR = "/var/run/corral/model"
GIT_CREDENTIALS_DIR = "/var/run/corral/git"
KUBE_TOKEN_DIR = "/var/run/corral/kube"
WIRE_TOKEN_KEY = "token"
POD_IP_ENV = "CORRAL_POD_IP"

# Clone, then put the checkout on the session's branch. Values arrive as positional
# parameters, never spliced into the script, so a hostile repo or ref cannot inject shell.
CHECKOUT_SCRIPT = """set -eu
repo="$1"; ref="$2"; branch="$3"; dest="$4"; creds="${5:-}"
if [ -n "$creds" ]; then
  set -- -c "credential.helper=store --file=$creds"
else
  set --
fi
git "$@" clone --quiet --no-checkout -- "$repo" "$dest"
cd "$dest"
if rev=$(git rev-parse --verify --quiet "refs/remotes/origin/$ref^{commit}"); then :
elif rev=$(git rev-parse --verify --quiet "$ref^{commit}"); then :
else
  git "$@" fetch --quiet origin "$ref"
  rev=$(git rev-parse --verify FETCH_HEAD^{commit})
fi
git checkout --quiet -B "$branch" "$rev"
"""


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


def restricted_security_context(run_as_user: int) -> dict[str, Any]:
    """What Pod Security `restricted` asks of every container, plus a read-only root."""
    return {
        "runAsNonRoot": True,
        "runAsUser": run_as_user,
        "runAsGroup": run_as_user,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_security_context(run_as_user: int) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": run_as_user,
        "runAsGroup": run_as_user,
        "fsGroup": run_as_user,
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


def _workspace_mount(granted_root: str) -> str:
    """The workspace volume holds the granted root: at /workspace, or at the root itself."""
    if granted_root == WORKSPACE_MOUNT or granted_root.startswith(WORKSPACE_MOUNT + "/"):
        return WORKSPACE_MOUNT
    return granted_root


def _validate(agent: Agent, session: Session) -> None:
    ws = session.spec.workspace
    if ws.ref.startswith("-"):
        raise SandboxSpecError(f"workspace.ref {ws.ref!r} must not start with '-'")
    if ws.repo.startswith("-"):
        raise SandboxSpecError(f"workspace.repo {ws.repo!r} must not start with '-'")
    if any(c in ws.ref for c in " \t\n\\~^:?*["):
        raise SandboxSpecError(f"workspace.ref {ws.ref!r} is not a valid git ref")
    if ws.granted_root in ("/", "/var", "/var/run", "/var/lib", "/tmp"):
        raise SandboxSpecError(f"workspace.grantedRoot {ws.granted_root!r} would cover the sandbox")
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


def _resources(agent: Agent) -> dict[str, Any]:
    res = agent.spec.sandbox.resources
    return res.wire() if res else {}


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def build_wire_secret(session: Session, wire_token: str) -> dict[str, Any]:
    name, namespace, uid = _meta(session)
    if len(wire_token) < 32:
        raise SandboxSpecError("the wire token must be at least 32 characters")
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
        "stringData": {WIRE_TOKEN_KEY: wire_token},
    }


def _egress_rule(cidr: str, ports: tuple[int, ...] | list[int]) -> dict[str, Any]:
    rule: dict[str, Any] = {"to": [{"ipBlock": {"cidr": cidr}}]}
    if ports:
        rule["ports"] = [{"protocol": "TCP", "port": p} for p in ports]
    return rule


def build_network_policy(
    agent: Agent, session: Session, settings: OperatorSettings
) -> dict[str, Any]:
    """Ingress: the wire port from the operator's pods only. Egress: what is allowed, no more.

    A NetworkPolicy selects pods, not containers, so the platform egress (API server, model
    endpoint) is open to the pod; the harness still holds nothing those endpoints accept.
    """
    name, namespace, uid = _meta(session)
    egress: list[dict[str, Any]] = []
    if settings.allow_dns:
        egress.append(
            {
                "to": [{"namespaceSelector": {}}],
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
                    "ports": [{"protocol": "TCP", "port": settings.harness_port}],
                }
            ],
            "egress": egress,
        },
    }


def build_pod(agent: Agent, session: Session, settings: OperatorSettings) -> dict[str, Any]:
    _validate(agent, session)
    name, namespace, uid = _meta(session)
    spec = session.spec
    creds = agent.spec.credentials
    image = agent.spec.sandbox.image or settings.image
    workspace_mount = _workspace_mount(spec.workspace.granted_root)
    branch = spec.workspace.branch or naming.session_branch(name)
    security = restricted_security_context(settings.run_as_user)
    custodian_url = f"http://$({POD_IP_ENV}):{settings.custodian_port}"
    pod_ip_env = {
        "name": POD_IP_ENV,
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
    }

    volumes: list[dict[str, Any]] = [
        {"name": "workspace", "emptyDir": {}},
        {"name": "state", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "custodian-state", "emptyDir": {}},
        {"name": "custodian-tmp", "emptyDir": {}},
        {
            "name": "wire-token",
            "secret": {
                "secretName": naming.wire_secret_name(name),
                "defaultMode": 0o440,
                "items": [{"key": WIRE_TOKEN_KEY, "path": WIRE_TOKEN_KEY}],
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

    # --- init: the checkout, with git credentials when the Agent has them.
    init_mounts: list[dict[str, Any]] = [
        {"name": "workspace", "mountPath": workspace_mount},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    checkout_args = [
        "-c",
        CHECKOUT_SCRIPT,
        "checkout",
        resolve_repo(spec.workspace.repo, settings.local_repo_root),
        spec.workspace.ref,
        naming.session_branch(name),
        workspace_mount,
    ]
    custodian_mounts: list[dict[str, Any]] = [
        {"name": "workspace", "mountPath": workspace_mount},
        {"name": "custodian-state", "mountPath": CUSTODIAN_STATE_MOUNT},
        {"name": "custodian-tmp", "mountPath": "/tmp"},
        {"name": "kube-token", "mountPath": KUBE_TOKEN_DIR, "readOnly": True},
    ]
    custodian_env: list[dict[str, Any]] = [
        pod_ip_env,
        _env("CORRAL_CUSTODIAN_ADDR", f"$({POD_IP_ENV}):{settings.custodian_port}"),
        _env("CORRAL_UPSTREAM_URL", settings.model_upstream_url),
        _env("CORRAL_SESSION_NAME", name),
        _env("CORRAL_SESSION_NAMESPACE", namespace),
        _env("CORRAL_SESSION_UID", uid),
        _env("CORRAL_STATE_DIR", CUSTODIAN_STATE_MOUNT),
        _env("CORRAL_AGENT_SPEC_JSON", json.dumps(agent.spec.wire(), sort_keys=True)),
        _env("CORRAL_KUBE_API", settings.kube_api_url),
        _env("CORRAL_KUBE_TOKEN_FILE", f"{KUBE_TOKEN_DIR}/token"),
        _env("CORRAL_SESSION_BRANCH", branch),
        _env("CORRAL_WORKSPACE", workspace_mount),
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
        custodian_mounts.append({"name": "model-key", "mountPath": MODEL_KEY_DIR, "readOnly": True})
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
        git_mount: dict[str, Any] = {
            "name": "git-credentials",
            "mountPath": GIT_CREDENTIALS_DIR,
            "readOnly": True,
        }
        custodian_mounts.append(git_mount)
        init_mounts.append(git_mount)
        custodian_env.append(
            _env("CORRAL_GIT_CREDENTIALS_FILE", f"{GIT_CREDENTIALS_DIR}/credentials")
        )
        checkout_args.append(f"{GIT_CREDENTIALS_DIR}/credentials")

    harness_env = [
        pod_ip_env,
        _env("CORRAL_HARNESS_ADDR", f"$({POD_IP_ENV}):{settings.harness_port}"),
        _env("CORRAL_STATE_DIR", STATE_MOUNT),
        _env("CORRAL_GRANTED_ROOT", spec.workspace.granted_root),
        _env("CORRAL_WIRE_TOKEN_FILE", f"{WIRE_TOKEN_DIR}/{WIRE_TOKEN_KEY}"),
        _env("CORRAL_CUSTODIAN_URL", custodian_url),
        _env("CORRAL_READ_ONLY", "true" if spec.read_only else "false"),
        _env("ANTHROPIC_BASE_URL", custodian_url),
        _env("HOME", "/tmp"),
    ]
    resources = _resources(agent)
    containers = [
        {
            "name": "harness",
            "image": image,
            "command": ["corral-harness"],
            "ports": [{"name": "wire", "containerPort": settings.harness_port, "protocol": "TCP"}],
            "env": harness_env,
            "workingDir": spec.workspace.granted_root,
            "readinessProbe": {
                "httpGet": {"path": "/readyz", "port": settings.harness_port},
                "periodSeconds": 1,
                "failureThreshold": 3,
            },
            "volumeMounts": [
                {"name": "workspace", "mountPath": workspace_mount},
                {"name": "state", "mountPath": STATE_MOUNT},
                {"name": "tmp", "mountPath": "/tmp"},
                {"name": "wire-token", "mountPath": WIRE_TOKEN_DIR, "readOnly": True},
            ],
            "resources": resources,
            "securityContext": dict(security),
        },
        {
            "name": "custodian",
            "image": image,
            "command": ["corral-custodian"],
            "ports": [
                {"name": "custodian", "containerPort": settings.custodian_port, "protocol": "TCP"}
            ],
            "env": custodian_env,
            "readinessProbe": {
                "httpGet": {"path": "/readyz", "port": settings.custodian_port},
                "periodSeconds": 1,
                "failureThreshold": 3,
            },
            "volumeMounts": custodian_mounts,
            "resources": {},
            "securityContext": dict(security),
        },
    ]
    init = {
        "name": "checkout",
        "image": image,
        "command": ["sh"],
        "args": checkout_args,
        "env": [_env("HOME", "/tmp"), _env("GIT_TERMINAL_PROMPT", "0")],
        "volumeMounts": init_mounts,
        "securityContext": dict(security),
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": settings.sandbox_service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Always",
        "securityContext": _pod_security_context(settings.run_as_user),
        "initContainers": [init],
        "containers": containers,
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
    agent: Agent, session: Session, settings: OperatorSettings, wire_token: str
) -> SandboxManifests:
    """Every manifest a Session owns. Raises SandboxSpecError on a spec that cannot work."""
    pod = build_pod(agent, session, settings)
    return SandboxManifests(
        secret=build_wire_secret(session, wire_token),
        network_policy=build_network_policy(agent, session, settings),
        pod=pod,
    )
