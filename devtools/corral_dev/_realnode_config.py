"""What the real node's components are told: containerd's, the kubelet's, kube-proxy's and the
CNI's configuration, and the cluster objects (RBAC, CoreDNS) the node adds. Pure rendering: no
process, file or network is touched here.

Every address is in 198.18.0.0/15 (RFC 2544 benchmarking space): the pods of node slot n in
198.18.n.0/24, the link between this host and the node's network namespace in
198.18.(128+n).0/30, Services in the control plane's range (198.19.0.0/16 for the node tier).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLUSTER_DOMAIN = "cluster.local"
BRIDGE = "corral0"
MAX_SLOTS = 64
KUBE_ROUTER_USER = "system:kube-router"
COREDNS_USER = "system:coredns"
DNS_NAMESPACE = "kube-system"
DNS_LABELS = {"k8s-app": "kube-dns"}
# The serving certificate names the API server by these DNS names (and not, today, by the
# Service's cluster IP): a client inside a pod verifies it by name.
API_SERVER_NAME = "kubernetes.default.svc"


@dataclass(frozen=True)
class Addresses:
    """The node's addresses, all derived from its slot on this machine (0..63)."""

    slot: int
    service_cidr: str

    def __post_init__(self) -> None:
        if not 0 <= self.slot < MAX_SLOTS:
            raise ValueError(f"slot {self.slot} not in 0..{MAX_SLOTS - 1}")
        net = ipaddress.ip_network(self.service_cidr)
        if not net.subnet_of(ipaddress.ip_network("198.18.0.0/15")):  # type: ignore[arg-type]
            raise ValueError(
                f"service range {self.service_cidr} is not in 198.18.0.0/15: pods would send "
                "traffic to addresses outside the benchmarking range"
            )

    @property
    def pod_cidr(self) -> str:
        return f"198.18.{self.slot}.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"198.18.{self.slot}.1"

    @property
    def host_ip(self) -> str:
        """This host's end of the link to the node's network namespace."""
        return f"198.18.{128 + self.slot}.1"

    @property
    def node_ip(self) -> str:
        """The node's InternalIP: its end of the link, reachable from this host."""
        return f"198.18.{128 + self.slot}.2"

    @property
    def link_prefix(self) -> int:
        return 30

    def service_ip(self, index: int) -> str:
        return str(ipaddress.ip_network(self.service_cidr)[index])

    @property
    def api_service_ip(self) -> str:
        return self.service_ip(1)

    @property
    def dns_service_ip(self) -> str:
        return self.service_ip(10)


def containerd_toml(work: Path, pause_image: str) -> str:
    """containerd 1.6 (config version 2) with its own root, state and sockets under `work`."""
    root = work / "containerd"
    return f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{root / "containerd.sock"}"
[ttrpc]
  address = "{root / "containerd.sock.ttrpc"}"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  # No CAP_SYS_RESOURCE here: the pause container's oom_score_adj -998 would be refused.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{work / "cni" / "net.d"}"
    max_conf_num = 1
"""


def cni_conflist(work: Path, addrs: Addresses) -> str:
    """A bridge with host-local addresses in the slot's pod range, and portmap."""
    config = {
        "cniVersion": "1.0.0",
        "name": "corral",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(work / "cni" / "ipam"),
                    "ranges": [[{"subnet": addrs.pod_cidr, "gateway": addrs.pod_gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(config, indent=2)


def kubelet_config(work: Path, addrs: Addresses) -> dict[str, Any]:
    """KubeletConfiguration with the settings this machine needs (see shared NOTES)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": addrs.node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        # The API server calls the kubelet without a client certificate; the kubelet is
        # reachable only from this host, through the node's own network namespace.
        "authentication": {
            "anonymous": {"enabled": True},
            "webhook": {"enabled": False},
            "x509": {},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "failCgroupV1": False,
        "clusterDNS": [addrs.dns_service_ip],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "",
        "containerRuntimeEndpoint": f"unix://{work / 'containerd' / 'containerd.sock'}",
        "podLogsDir": str(work / "pod-logs"),
        "serializeImagePulls": False,
        "registerNode": True,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": True,
        "maxPods": 110,
        "podPidsLimit": 4096,
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "shutdownGracePeriod": "0s",
        "volumePluginDir": str(work / "kubelet-plugins"),
        "logging": {"format": "text", "verbosity": 1},
    }


def kube_proxy_config(kubeconfig: Path, node_name: str, addrs: Addresses) -> dict[str, Any]:
    """kube-proxy in iptables mode; conntrack sysctls left as they are (they are global)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "bindAddress": "0.0.0.0",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "clusterCIDR": addrs.pod_cidr,
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"masqueradeAll": False, "syncPeriod": "10s", "minSyncPeriod": "0s"},
        "nodePortAddresses": [f"{addrs.node_ip}/32"],
        "logging": {"format": "text", "verbosity": 1},
    }


def kube_router_args(kubeconfig: Path, node_name: str, addrs: Addresses) -> list[str]:
    """kube-router with only its NetworkPolicy firewall (iptables + ipset; no NFQUEUE)."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node_name}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--enable-cni=false",
        "--enable-ibgp=false",
        "--enable-overlay=false",
        f"--service-cluster-ip-range={addrs.service_cidr}",
        "--metrics-port=0",
        "--health-port=20244",
        "--iptables-sync-period=1m",
        "--v=1",
    ]


# ------------------------------------------------------------------------ cluster objects


def _binding(name: str, role: str, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "corral-node"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


def _role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "corral-node"}},
        "rules": rules,
    }


def _read(groups: list[str], resources: list[str]) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": ["get", "list", "watch"]}


def rbac(node_name: str) -> list[dict[str, Any]]:
    """The node's identities: the kubelet as `system:node:<name>` (the API server runs RBAC
    only, no Node authorizer, so its built-in `system:node` role is bound to it), kube-router
    and CoreDNS. kube-proxy and kube-scheduler use their built-in bindings."""
    return [
        _binding(f"corral-node:{node_name}", "system:node", f"system:node:{node_name}"),
        _role(
            "corral-node:kube-router",
            [
                _read([""], ["pods", "namespaces", "nodes", "services", "endpoints"]),
                _read(["networking.k8s.io"], ["networkpolicies"]),
                _read(["discovery.k8s.io"], ["endpointslices"]),
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
            ],
        ),
        _binding("corral-node:kube-router", "corral-node:kube-router", KUBE_ROUTER_USER),
        _role(
            "corral-node:coredns",
            [
                _read([""], ["endpoints", "services", "pods", "namespaces"]),
                _read(["discovery.k8s.io"], ["endpointslices"]),
            ],
        ),
        _binding("corral-node:coredns", "corral-node:coredns", COREDNS_USER),
    ]


COREFILE = f""".:53 {{
    errors
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig /etc/coredns/kubeconfig corral
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    cache 30
}}
"""


API_SLICE_NAME = "kubernetes-corral-node"


def api_endpoint_slice(node_ip: str, api_port: int) -> dict[str, Any]:
    """An EndpointSlice for the `kubernetes` Service: the API server, relayed at node_ip."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": API_SLICE_NAME,
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "corral-realnode",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [node_ip], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": api_port, "protocol": "TCP"}],
    }


def pod_kubeconfig(ca_pem: str, cert_pem: str, key_pem: str, user: str, api_ip: str) -> str:
    """A kubeconfig for a pod that reaches the API server through the `kubernetes` Service and
    verifies it by its in-cluster name."""
    import base64

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "corral",
                "cluster": {
                    "server": f"https://{api_ip}:443",
                    "tls-server-name": API_SERVER_NAME,
                    "certificate-authority-data": b64(ca_pem),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(cert_pem),
                    "client-key-data": b64(key_pem),
                },
            }
        ],
        "contexts": [{"name": "corral", "context": {"cluster": "corral", "user": user}}],
        "current-context": "corral",
    }
    return json.dumps(config, indent=2)


def coredns_objects(image: str, kubeconfig: str, addrs: Addresses) -> list[dict[str, Any]]:
    """CoreDNS as a Deployment in kube-system behind the `kube-dns` Service, answering
    cluster.local only (no forwarder: a name outside the cluster does not resolve)."""
    meta = {"namespace": DNS_NAMESPACE, "labels": dict(DNS_LABELS)}
    container = {
        "name": "coredns",
        "image": image,
        "imagePullPolicy": "Never",
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [
            {"name": "dns", "containerPort": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": 8181},
            "periodSeconds": 1,
        },
        "resources": {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"memory": "128Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "coredns", **meta},
            "stringData": {"Corefile": COREFILE, "kubeconfig": kubeconfig},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", **meta},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": dict(DNS_LABELS)},
                "template": {
                    "metadata": {"labels": dict(DNS_LABELS)},
                    "spec": {
                        "automountServiceAccountToken": False,
                        "enableServiceLinks": False,
                        "dnsPolicy": "Default",
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 65532,
                            "runAsGroup": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"},
                            # Port 53 as a non-root uid, without a capability.
                            "sysctls": [
                                {"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"}
                            ],
                        },
                        "containers": [container],
                        "volumes": [{"name": "config", "secret": {"secretName": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", **meta},
            "spec": {
                "clusterIP": addrs.dns_service_ip,
                "selector": dict(DNS_LABELS),
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": 53, "protocol": "TCP"},
                ],
            },
        },
    ]
