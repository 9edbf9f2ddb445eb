"""The operator's own settings: what the pod builder and the handlers need beyond the specs.

Pure data, filled from the command line (see `main.py`) or directly by tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EgressTarget:
    """A destination the whole sandbox pod may reach besides the Agent's allowlist."""

    cidr: str
    ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class OperatorSettings:
    # The sandbox image, used when the Agent names none.
    image: str = "ghcr.io/corral-dev/corral-sandbox:0.1.0"
    # Where the operator runs and how its pods are labelled: the sandbox's NetworkPolicy admits
    # wire traffic from exactly these pods.
    operator_namespace: str = "corral-system"
    operator_pod_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "corral-operator"}
    )
    # The identity the custodian acts as (its token is the pod's only one).
    sandbox_service_account: str = "corral-sandbox"
    harness_port: int = 8080
    custodian_port: int = 8081
    # The projected token is bound to this audience and expires after this long.
    token_audience: str = "https://kubernetes.default.svc.cluster.local"
    token_expiry_seconds: int = 3600
    # The API server as the custodian reaches it, and the ConfigMap holding its CA (None: no CA
    # file is projected; the custodian then uses its default trust).
    kube_api_url: str = "https://kubernetes.default.svc"
    kube_ca_configmap: str | None = "kube-root-ca.crt"
    # The real model endpoint behind the custodian's proxy.
    model_upstream_url: str = "https://api.anthropic.com"
    # Egress every sandbox needs (the API server and the model endpoint, for the custodian).
    platform_egress: tuple[EgressTarget, ...] = ()
    allow_dns: bool = True
    run_as_user: int = 10001  # the sandbox image's numeric uid
    # Long-poll window for one wait call on the wire, in seconds.
    wire_wait_seconds: float = 20.0
    # A development aid for local clusters (`make dev-cluster`), off by default: an absolute
    # directory on the node against which a relative `workspace.repo` (e.g. `demo/repo`) is
    # resolved. Without it a relative repo is refused: a cluster has nothing to clone it from.
    local_repo_root: str | None = None
