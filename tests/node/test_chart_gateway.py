"""The chart's egress gateway (docs/egress.md), rendered with `helm template`: its Deployment,
Service, PodDisruptionBudget and NetworkPolicy; its rights (pods, read-only, where the operator
watches); the operator pointed at its Service with just the rights to read it; and the values
it replaced refused with the name of what replaced them."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from .test_chart import find, helm_template, operator_args, rendered

WATCH = f"watchNamespaces={json.dumps(['team-a', 'team-b'])}"
GATEWAY = "corral-egress-gateway"
SELECTOR = {"app.kubernetes.io/name": GATEWAY, "app.kubernetes.io/instance": "corral"}


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in find(docs, kind) if d["metadata"]["name"] == name]
    return doc


def grants(role: dict[str, Any]) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(apiGroup, resource, verb, resourceNames) for every verb a role grants."""
    return sorted(
        (group, resource, verb, tuple(rule.get("resourceNames", ())))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    )


PODS_READ = [("", "pods", v, ()) for v in ("get", "list", "watch")]


def gateway_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(named(docs, "Deployment", GATEWAY)["spec"]["template"]["spec"]["containers"][0])


def test_the_deployment_runs_two_replicas_of_the_operator_image_locked_down() -> None:
    docs = rendered(
        WATCH,
        'egressGateway.denyCidrs=["198.18.0.0/15", "203.0.113.0/24"]',
        'image={"repository": "registry.example/corral", "tag": "9.9"}',
    )
    deployment = named(docs, "Deployment", GATEWAY)
    assert deployment["metadata"]["namespace"] == "corral-system"
    assert SELECTOR.items() <= deployment["metadata"]["labels"].items()
    assert deployment["metadata"]["labels"]["app.kubernetes.io/part-of"] == "corral"
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"]["matchLabels"] == SELECTOR
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["template"]["metadata"]["labels"] == SELECTOR
    assert pod["serviceAccountName"] == GATEWAY and pod["automountServiceAccountToken"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == SELECTOR

    container = gateway_container(docs)
    # The same image as the operator's own Deployment.
    operator = named(docs, "Deployment", "corral-operator")
    assert container["image"] == "registry.example/corral:9.9"
    assert container["image"] == operator["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["command"] == ["/opt/corral/bin/corral-gateway"]
    assert container["args"] == [
        "--listen=:3128",
        "--admin=:9091",
        "--namespace=team-a",
        "--namespace=team-b",
        "--deny-cidr=198.18.0.0/15",
        "--deny-cidr=203.0.113.0/24",
        "--connect-timeout=10s",
        "--idle-timeout=5m",
        "--drain-timeout=90s",
        "--binding-key-file=/etc/corral/egress-binding/key",
    ]
    # A stopping replica lets its tunnels finish for drainSeconds; the kubelet waits 10 s more.
    assert pod["terminationGracePeriodSeconds"] == 100
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"proxy": 3128, "admin": 9091}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["livenessProbe"]["tcpSocket"] == {"port": "proxy"}
    assert container["resources"] == {
        "requests": {"cpu": "50m", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    }
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_values_set_replicas_resources_and_timeouts() -> None:
    docs = rendered(
        WATCH,
        'egressGateway={"replicas": 3, "connectTimeout": "3s", "idleTimeout": "1m30s", '
        '"resources": {"requests": {"cpu": "200m", "memory": "128Mi"}, '
        '"limits": {"cpu": "2", "memory": "512Mi"}}}',
    )
    assert named(docs, "Deployment", GATEWAY)["spec"]["replicas"] == 3
    container = gateway_container(docs)
    assert "--connect-timeout=3s" in container["args"]
    assert "--idle-timeout=1m30s" in container["args"]
    assert not any(a.startswith("--deny-cidr") for a in container["args"])
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "512Mi"}
    for bad in ('egressGateway.connectTimeout="ten seconds"', 'egressGateway.denyCidrs=["x"]'):
        done = helm_template(WATCH, bad)
        assert done.returncode != 0 and "/egressGateway/" in done.stderr, (bad, done.stderr)


def test_watching_every_namespace_the_gateway_watches_every_namespace() -> None:
    docs = rendered("watchNamespaces=[]", 'sandboxNamespaces=["agents"]')
    assert not any(a.startswith("--namespace") for a in gateway_container(docs)["args"])
    assert grants(named(docs, "ClusterRole", GATEWAY)) == PODS_READ
    binding = named(docs, "ClusterRoleBinding", GATEWAY)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": GATEWAY,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": GATEWAY, "namespace": "corral-system"}
    ]
    assert [r for r in find(docs, "Role") if r["metadata"]["name"] == GATEWAY] == []


def test_the_gateway_may_read_pods_in_each_watched_namespace_and_nothing_else() -> None:
    docs = rendered(WATCH)
    account = named(docs, "ServiceAccount", GATEWAY)
    assert account["metadata"]["namespace"] == "corral-system"
    for ns in ("team-a", "team-b"):
        (role,) = [r for r in find(docs, "Role", ns) if r["metadata"]["name"] == GATEWAY]
        assert grants(role) == PODS_READ
        (binding,) = [b for b in find(docs, "RoleBinding", ns) if b["roleRef"]["name"] == GATEWAY]
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": GATEWAY, "namespace": "corral-system"}
        ]
    # Nothing else names the gateway's identity: no other binding, no cluster-wide role.
    subjects = [
        (b["kind"], b["metadata"].get("namespace"))
        for b in find(docs, "RoleBinding") + find(docs, "ClusterRoleBinding")
        if any(s["name"] == GATEWAY for s in b["subjects"])
    ]
    assert sorted(subjects) == [("RoleBinding", "team-a"), ("RoleBinding", "team-b")]
    assert [r for r in find(docs, "ClusterRole") if r["metadata"]["name"] == GATEWAY] == []


def test_the_service_names_the_proxy_and_admin_ports_and_selects_the_gateway() -> None:
    service = named(rendered(WATCH), "Service", GATEWAY)
    assert service["metadata"]["namespace"] == "corral-system"
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == SELECTOR
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    # Numbers, not names: the sandbox NetworkPolicy names this port, and not every CNI
    # follows named ports there.
    assert ports == {"proxy": (3128, 3128), "admin": (9091, 9091)}


def test_the_disruption_budget_lets_one_replica_go_at_a_time() -> None:
    budget = named(rendered(WATCH), "PodDisruptionBudget", GATEWAY)
    assert budget["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in budget["spec"]
    assert budget["spec"]["selector"]["matchLabels"] == SELECTOR


def test_the_network_policy_admits_bound_pods_to_the_proxy_and_the_operator_to_admin() -> None:
    prometheus = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    for metrics_from, extra in (([], []), ([prometheus], [prometheus])):
        docs = rendered(WATCH, f"egressGateway.metricsFrom={json.dumps(metrics_from)}")
        policy = named(docs, "NetworkPolicy", GATEWAY)["spec"]
        assert policy["podSelector"] == {"matchLabels": SELECTOR}
        assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
        by_port = {rule["ports"][0]["port"]: rule["from"] for rule in policy["ingress"]}
        assert all(len(rule["ports"]) == 1 for rule in policy["ingress"])
        assert by_port[3128] == [
            {
                "namespaceSelector": {},
                "podSelector": {"matchLabels": {"corral.dev/egress": "gateway"}},
            }
        ]
        operator = {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "corral-operator",
                    "app.kubernetes.io/instance": "corral",
                }
            }
        }
        assert by_port[9091] == [operator, *extra]
        assert set(by_port) == {3128, 9091}
        # The way out for every sandbox: nothing restricts where the gateway itself dials.
        assert policy["egress"] == [{}]


def test_a_service_monitor_scrapes_the_admin_port_when_one_is_asked_for() -> None:
    assert find(rendered(WATCH), "ServiceMonitor") == []
    docs = rendered(WATCH, 'metrics.serviceMonitor={"enabled": true, "labels": {"release": "p"}}')
    monitor = named(docs, "ServiceMonitor", GATEWAY)
    service = named(docs, "Service", GATEWAY)
    assert monitor["metadata"]["labels"]["release"] == "p"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    # Only the gateway's Service: not the operator's metrics Service too.
    operator_metrics = named(docs, "Service", "corral-operator-metrics")
    assert not (
        monitor["spec"]["selector"]["matchLabels"].items()
        <= operator_metrics["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"] == [
        {"port": "admin", "path": "/metrics", "interval": "30s"}
    ]


def test_the_operator_reads_the_gateway_service_and_lists_its_pods_only() -> None:
    docs = rendered(WATCH)
    args = operator_args(docs)
    assert "--egress-gateway-service=corral-system/corral-egress-gateway" in args
    assert not any(a.startswith(("--dns-", "--no-dns-egress", "--egress-gateway=")) for a in args)
    role = named(docs, "Role", "corral-operator-egress-gateway")
    assert role["metadata"]["namespace"] == "corral-system"
    assert grants(role) == [
        ("", "pods", "list", ()),
        ("", "services", "get", (GATEWAY,)),
    ]
    binding = named(docs, "RoleBinding", "corral-operator-egress-gateway")
    assert binding["metadata"]["namespace"] == "corral-system"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "corral-operator-egress-gateway",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "corral-operator", "namespace": "corral-system"}
    ]


@pytest.mark.parametrize(
    ("value", "replaced_by"),
    [
        ("sandbox.apiServerEgress=true", "reaches the API server through the egress gateway"),
        ("sandbox.apiServerEgress=false", "reaches the API server through the egress gateway"),
        ("sandbox.allowDnsEgress=true", "the egress gateway resolves names"),
        ('sandbox.dnsNamespace="kube-system"', "the egress gateway resolves names"),
        ('sandbox.dnsPodLabels={"k8s-app": "kube-dns"}', "the egress gateway resolves names"),
    ],
)
def test_a_removed_value_fails_naming_what_replaced_it(value: str, replaced_by: str) -> None:
    done = helm_template(WATCH, value)
    assert done.returncode != 0
    key = value.split("=", 1)[0]
    assert f"{key} was removed: " in done.stderr, done.stderr
    assert replaced_by in done.stderr and "docs/egress.md" in done.stderr, done.stderr


def test_platform_egress_takes_host_names_and_cidrs_as_listed() -> None:
    listed = ["git.example.com:443,22", "*.example.net", "198.18.0.1/32:443", "fd00::/8"]
    args = operator_args(rendered(WATCH, f"sandbox.platformEgress={json.dumps(listed)}"))
    assert [a for a in args if a.startswith("--platform-egress")] == [
        f"--platform-egress={item}" for item in listed
    ]
    for bad in ("https://git.example.com", "git.example.com:https", "fd00::/8:443", "a b"):
        done = helm_template(WATCH, f"sandbox.platformEgress={json.dumps([bad])}")
        assert done.returncode != 0 and "/sandbox/platformEgress/0" in done.stderr, (bad, done)


def test_the_operator_and_the_gateway_share_the_binding_key_and_nobody_else_mounts_it() -> None:
    docs = rendered(WATCH)
    (secret,) = [
        d for d in docs if d["kind"] == "Secret" and "binding-key" in d["metadata"]["name"]
    ]
    assert len(base64.b64decode(secret["data"]["key"])) == 48
    mounting = []
    for deployment in find(docs, "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        volumes = [v for v in spec.get("volumes") or [] if "secret" in v]
        if any(v["secret"]["secretName"] == secret["metadata"]["name"] for v in volumes):
            mounting.append(deployment["metadata"]["name"])
            args = spec["containers"][0].get("args") or []
            assert any(a.endswith("binding-key-file=/etc/corral/egress-binding/key") for a in args)
    assert sorted(mounting) == ["corral-egress-gateway", "corral-operator"]


def test_fixed_names_and_public_ranges_reach_the_gateway() -> None:
    docs = rendered(
        WATCH,
        'egressGateway.hosts={"artifacts.corp.example": ["203.0.113.7", "203.0.113.8"]}',
        'egressGateway.allowRanges=["100.70.0.0/16"]',
    )
    deployment = named(docs, "Deployment", GATEWAY)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--allow-range=100.70.0.0/16" in container["args"]
    assert "--hosts-file=/etc/corral/egress-hosts/hosts" in container["args"]
    hosts = named(docs, "ConfigMap", f"{GATEWAY}-hosts")["data"]["hosts"].split()
    assert hosts == [
        "203.0.113.7",
        "artifacts.corp.example",
        "203.0.113.8",
        "artifacts.corp.example",
    ]
    # Without names there is no file, and a bad address is refused by the schema.
    plain = named(rendered(WATCH), "Deployment", GATEWAY)["spec"]["template"]["spec"]
    assert not any("hosts-file" in a for a in plain["containers"][0]["args"])
    bad = helm_template(WATCH, 'egressGateway.hosts={"a.example": ["not an address"]}')
    assert bad.returncode != 0 and "egressGateway/hosts" in bad.stderr, bad.stderr


@pytest.mark.parametrize(("value", "timeout", "grace"), [
    ("egressGateway.drainSeconds=0", "0s", 10),
    # A release installed before drainSeconds and upgraded with --reuse-values has no such key.
    ("egressGateway.drainSeconds=null", "90s", 100),
])  # fmt: skip
def test_the_drain_follows_drain_seconds_and_its_default_when_the_values_lack_it(
    value: str, timeout: str, grace: int
) -> None:
    docs = rendered(WATCH, value)
    assert f"--drain-timeout={timeout}" in gateway_container(docs)["args"]
    pod = named(docs, "Deployment", GATEWAY)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == grace
