"""The operator's own settings: what the pod builder and the handlers need beyond the specs.

Pure data, filled from the command line (see `main.py`) or directly by tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral_api.providers import ModelProvider


@dataclass(frozen=True)
class EgressTarget:
    """A destination of the platform's that the custodian (never the agent) may reach through
    the egress gateway, besides those the operator derives itself (docs/egress.md): a host by
    name or a CIDR. Platform destinations may be private addresses (the operator's settings
    are trusted; the agent's rules are not)."""

    cidr: str | None = None
    ports: tuple[int, ...] = ()
    host: str | None = None


@dataclass(frozen=True)
class EgressGateway:
    """Where sandbox pods reach the egress gateway (docs/egress.md), as the operator read it
    from the gateway's Service at start: its address (sandboxes have no DNS), its pods'
    namespace and labels (the only peer a sandbox's NetworkPolicy allows), its admin port
    (each replica's decision records)."""

    address: str  # the Service's clusterIP
    port: int  # the Service's `proxy` port
    namespace: str
    pod_labels: dict[str, str]
    admin_port: int = 9091  # each replica's records, read from its pod address
    # The proxy port as the pods' containers listen on it (the Service's targetPort, a number
    # or a port name): the sandbox NetworkPolicy's one port. None: the same as `port`.
    pod_port: int | str | None = None
    # The key that signs each pod's binding (shared with the gateway, which trusts no binding
    # without its signature when it has the key); None: bindings go unsigned.
    binding_key: str | None = field(default=None, repr=False)

    @property
    def proxy_url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def policy_port(self) -> int | str:
        return self.pod_port if self.pod_port is not None else self.port


class GatewayServiceError(ValueError):
    """The Service named by --egress-gateway-service cannot serve as the gateway."""


def gateway_from_service(service: dict[str, Any]) -> EgressGateway:
    """The gateway as its Service describes it: the clusterIP (sandboxes have no DNS), the
    `proxy` and `admin` ports and the selector of its pods. GatewayServiceError naming what
    is missing."""
    md = service.get("metadata") or {}
    spec = service.get("spec") or {}
    where = f"Service {md.get('namespace')}/{md.get('name')}"
    address = spec.get("clusterIP")
    if not address or address == "None":
        raise GatewayServiceError(f"{where} has no clusterIP (a headless Service cannot be it)")
    ports = {p.get("name"): p for p in spec.get("ports") or []}
    proxy = ports.get("proxy")
    if proxy is None:
        raise GatewayServiceError(f"{where} has no port named 'proxy'")
    selector = dict(spec.get("selector") or {})
    if not selector:
        raise GatewayServiceError(f"{where} has no selector: its pods cannot be named")
    admin = ports.get("admin") or {}
    admin_target = admin.get("targetPort")
    return EgressGateway(
        address=str(address),
        port=int(proxy["port"]),
        namespace=str(md.get("namespace") or ""),
        pod_labels=selector,
        admin_port=int(admin_target if isinstance(admin_target, int) else admin.get("port", 9091)),
        pod_port=proxy.get("targetPort", proxy["port"]),
    )


@dataclass(frozen=True)
class ContainerResources:
    """Requests and limits of one container, as Kubernetes quantities."""

    cpu_request: str
    memory_request: str
    cpu_limit: str
    memory_limit: str

    def wire(self) -> dict[str, dict[str, str]]:
        return {
            "requests": {"cpu": self.cpu_request, "memory": self.memory_request},
            "limits": {"cpu": self.cpu_limit, "memory": self.memory_limit},
        }


@dataclass(frozen=True)
class SandboxResources:
    """Each sandbox container's requests and limits; `tools` yields to the Agent's own."""

    harness: ContainerResources = ContainerResources("100m", "256Mi", "1", "1Gi")
    tools: ContainerResources = ContainerResources("250m", "512Mi", "2", "2Gi")
    custodian: ContainerResources = ContainerResources("50m", "128Mi", "500m", "512Mi")
    install_exec: ContainerResources = ContainerResources("10m", "16Mi", "100m", "64Mi")
    checkout: ContainerResources = ContainerResources("100m", "128Mi", "1", "1Gi")


@dataclass(frozen=True)
class VolumeSizes:
    """The sizeLimit of every emptyDir of the sandbox pod."""

    workspace: str = "10Gi"
    state: str = "1Gi"  # the harness's durable state, and the custodian's
    tmp: str = "1Gi"  # each container's own /tmp
    exec_bin: str = "128Mi"  # the exec service's binary, copied by the init container
    exec_socket: str = "1Mi"  # the exec service's Unix socket (medium: Memory)


@dataclass(frozen=True)
class OperatorSettings:
    # Corral's image: the harness, the custodian and the init containers always run it; the
    # tools container runs it too unless the Agent names its own (spec.sandbox.image).
    image: str = "ghcr.io/corral-dev/corral-sandbox:0.1.0"
    # Where the operator runs and how its pods are labelled: the sandbox's NetworkPolicy admits
    # wire and usage traffic from exactly these pods.
    operator_namespace: str = "corral-system"
    operator_pod_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "corral-operator"}
    )
    # The identity the custodian acts as (its token is the pod's only one).
    sandbox_service_account: str = "corral-sandbox"
    harness_port: int = 8080
    # The custodian's two ports: one for the harness (the credential), one for the operator
    # (the wire token; its usage record).
    custodian_port: int = 8081
    custodian_operator_port: int = 8082
    # The projected token is bound to this audience and expires after this long.
    token_audience: str = "https://kubernetes.default.svc.cluster.local"
    token_expiry_seconds: int = 3600
    # The API server as the custodian reaches it, and the ConfigMap holding its CA (None: no CA
    # file is projected; the custodian then uses its default trust).
    kube_api_url: str = "https://kubernetes.default.svc"
    kube_ca_configmap: str | None = "kube-root-ca.crt"
    # The real model endpoint behind the custodian's proxy: the implicit `anthropic`
    # provider's, when the platform defines no modelProviders.
    model_upstream_url: str = "https://api.anthropic.com"
    # The platform's model providers (docs/providers.md): Agents name one in spec.provider;
    # each becomes its custodians' credentialed destinations. Empty: the implicit one above.
    model_providers: tuple[ModelProvider, ...] = ()
    # The OTLP/HTTP collector each sandbox's custodian relays its harness's traces to
    # (docs/tracing.md); None: no traces leave the pod. Behind the gateway the custodian's
    # binding names it; without one, its address must be in the platform egress.
    otlp_endpoint: str | None = None
    # The model catalog overlay (docs/model-catalog.md): a ConfigMap of this name in the
    # Session's namespace (the chart creates one in each), key `models.json`, mounted into the
    # harness and the custodian. None: both use the catalog shipped in the image.
    model_catalog_configmap: str | None = None
    # The long-term memory database (docs/memory.md): a PostgreSQL DSN, read from the chart's
    # Secret at start and copied into each Session's own Secret for its custodian. None: the
    # custodians have no store and Agents' memory stays empty (recall is fail-open).
    memory_dsn: str | None = field(default=None, repr=False)
    # The custodian's destinations beyond the model upstream, the API server, the Session's
    # git host and the Agent's hooks (which the operator allows by itself).
    platform_egress: tuple[EgressTarget, ...] = ()
    # The egress gateway: the one way out of a sandbox pod (docs/egress.md). None (a local
    # control plane's tests, whose sandboxes are processes): the NetworkPolicy allows the
    # CIDR rules alone and host rules reach nothing.
    egress_gateway: EgressGateway | None = None
    # Without a gateway, DNS egress (when allowed) goes only to the cluster's DNS pods; with
    # one, a sandbox has no DNS at all (the gateway resolves names).
    allow_dns: bool = True
    dns_namespace: str = "kube-system"
    dns_pod_labels: dict[str, str] = field(default_factory=lambda: {"k8s-app": "kube-dns"})
    # Three roles, three numeric uids (each also its primary gid), and one shared fsGroup.
    # Secrets are kept from a container by not mounting them, not by file modes.
    harness_uid: int = 10001
    tools_uid: int = 10002
    custodian_uid: int = 10003
    fs_group: int = 10000
    resources: SandboxResources = field(default_factory=SandboxResources)
    volume_sizes: VolumeSizes = field(default_factory=VolumeSizes)
    # Long-poll window for one wait call on the wire, in seconds.
    wire_wait_seconds: float = 20.0
    # The most the operator reads of any one answer of a harness (its history above all) and
    # of any one archived object: beyond it the read stops and the connection is closed, so a
    # compromised harness cannot exhaust the operator's memory (docs/operations.md).
    max_history_bytes: int = 64 * 1024 * 1024
    # Updates and deletes the operator keeps in flight at once (kube.py; ADR 0091).
    api_writes_in_flight: int = 6
    # A development aid for local clusters (`make dev-cluster`), off by default: an absolute
    # directory on the node against which a relative `workspace.repo` (e.g. `demo/repo`) is
    # resolved. Without it a relative repo is refused: a cluster has nothing to clone it from.
    local_repo_root: str | None = None
    # `json` or `text`: the operator's own log lines, and CORRAL_LOG_FORMAT for the harness and
    # the custodian of every sandbox it builds (docs/observability.md).
    log_format: str = "text"
    # History that outlives the pod (docs/history.md): the archive's directory (the chart
    # mounts a PersistentVolumeClaim there; None: nothing is archived), and how long after a
    # Session finished its pod may wait for a failing archive before it goes anyway.
    archive_dir: str | None = None
    archive_deadline_seconds: float = 60.0
    # Or S3-compatible object storage (docs/history.md): endpoint URL, bucket, region, a key
    # prefix, and the directory where the operator's pod mounts the credentials Secret.
    archive_s3_endpoint: str | None = None
    archive_s3_bucket: str = ""
    archive_s3_region: str = "us-east-1"
    archive_s3_prefix: str = ""
    archive_s3_credentials_dir: str | None = None

    @property
    def archives(self) -> bool:
        """An archive is configured: a Session's conversation outlives its pod there."""
        return bool(self.archive_dir or self.archive_s3_endpoint)

    @property
    def run_as_user(self) -> int:
        """The uid of a pod that runs a workspace command and holds nothing (Evidence checks)."""
        return self.tools_uid
