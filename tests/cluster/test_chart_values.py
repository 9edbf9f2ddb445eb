"""The chart as a platform team installs it (docs/operations.md, charts/corral/README.md), rendered
with the pinned `helm template` and no `--kube-version`: the documented values alone render;
the Kubernetes version is checked where a cluster answers; every workload takes its placement,
pull secrets, pod labels and annotations; every container has resources; the operator has a
readiness probe, an fsGroup for the archive, and a NetworkPolicy of its own; the deployed
memory database admits the egress gateway alone. test_chart_upgrade.py installs it for real."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral_dev import controlplane
from corral_dev._realnode_stack import CHART

pytestmark = pytest.mark.timeout(120)

WATCH = 'watchNamespaces=["agents"]'
OPERATOR_SELECTOR = {
    "app.kubernetes.io/name": "corral-operator",
    "app.kubernetes.io/instance": "corral",
}
GATEWAY_SELECTOR = {
    "app.kubernetes.io/name": "corral-egress-gateway",
    "app.kubernetes.io/instance": "corral",
}


def helm_template(
    *values: str, chart: Path = CHART, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """`helm template` as the docs write it: no --kube-version, helm's own capabilities."""
    args = [str(controlplane.binaries() / "helm"), "template", "corral", str(chart)]
    args += ["--namespace", "corral-system", *extra]
    for value in values:
        args += ["--set-json", value]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def rendered(*values: str) -> list[dict[str, Any]]:
    done = helm_template(*values)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
    }


def test_the_documented_values_alone_render_without_a_kube_version() -> None:
    done = helm_template(WATCH)
    # Chart.yaml's kubeVersion used to fail this: helm template checks it against its own
    # default version (v1.20.0 for a helm built without release ldflags, like ours).
    assert done.returncode == 0, done.stderr
    assert "kubeVersion" not in (CHART / "Chart.yaml").read_text().split("#")[0]
    # A version given by hand, without a cluster to ask, is not refused either: the check
    # runs where a cluster answers (`helm install`; test_chart_upgrade.py).
    old = helm_template(WATCH, extra=("--kube-version", "1.30.0"))
    assert old.returncode == 0, old.stderr


@pytest.mark.parametrize(
    ("version", "cluster", "refused"),
    [("v1.32.9", True, True), ("v1.32.9", False, False), ("v1.33.0", True, False),
     ("v1.34.4-eks-1", True, False), ("v1.20.0", False, False)],
)  # fmt: skip
def test_the_version_check_refuses_only_an_old_cluster(
    tmp_path: Path, version: str, cluster: bool, refused: bool
) -> None:
    """The chart's own helper, called with what `lookup` and the capabilities would say."""
    chart = tmp_path / "corral"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-version-probe.yaml").write_text(
        '{{- include "corral.requireKubeVersion" '
        f'(dict "version" "{version}" "cluster" {str(cluster).lower()}) }}}}\n'
    )
    done = helm_template(WATCH, chart=chart)
    if refused:
        assert done.returncode != 0
        assert (
            f"this cluster runs Kubernetes {version}; Corral's chart needs 1.33.0 or later"
            in done.stderr
        ), done.stderr
    else:
        assert done.returncode == 0, done.stderr


def test_every_workload_takes_its_placement_pull_secrets_and_pod_metadata() -> None:
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    placement = {
        "nodeSelector": {"pool": "corral"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "corral", "effect": "NoSchedule"}
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [zone]}
            }
        },
        "priorityClassName": "corral-critical",
        "podAnnotations": {"example.com/team": "platform"},
        "podLabels": {"team": "platform"},
    }
    docs = rendered(
        WATCH,
        'imagePullSecrets=[{"name": "regcred"}]',
        f"operator={json.dumps(placement)}",
        f"egressGateway={json.dumps(placement)}",
        f"memory.postgres={json.dumps({'deploy': True, **placement})}",
    )
    pods = workloads(docs)
    assert set(pods) == {"corral-operator", "corral-egress-gateway", "corral-memory"}
    for name, template in pods.items():
        spec, meta = template["spec"], template["metadata"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}], name
        assert spec["nodeSelector"] == placement["nodeSelector"], name
        assert spec["tolerations"] == placement["tolerations"], name
        # The gateway's own default (spread across nodes) gives way to the value.
        assert spec["affinity"] == placement["affinity"], name
        assert spec["priorityClassName"] == "corral-critical", name
        assert meta["annotations"] == placement["podAnnotations"], name
        assert meta["labels"]["team"] == "platform", name
    # The selector labels stay: each pod still matches its Deployment, Service and policies.
    assert OPERATOR_SELECTOR.items() <= pods["corral-operator"]["metadata"]["labels"].items()
    assert GATEWAY_SELECTOR.items() <= pods["corral-egress-gateway"]["metadata"]["labels"].items()
    # None of it set: the defaults, and no empty keys.
    plain = workloads(rendered(WATCH))
    operator = plain["corral-operator"]
    for key in ("imagePullSecrets", "nodeSelector", "tolerations", "priorityClassName"):
        assert key not in operator["spec"], key
    # The operator's own default affinity: its replicas beside the archive's claim (below).
    assert set(operator["spec"]["affinity"]) == {"podAffinity"}
    assert operator["metadata"] == {"labels": OPERATOR_SELECTOR}
    gateway = plain["corral-egress-gateway"]["spec"]
    assert "podAntiAffinity" in gateway["affinity"]


def test_pod_labels_cannot_take_the_selector_labels() -> None:
    for component in ("operator", "egressGateway", "memory.postgres"):
        value = {"podLabels": {"app.kubernetes.io/name": "mine"}}
        done = helm_template(WATCH, f"{component}={json.dumps(value)}")
        assert done.returncode != 0, component
        # The path names the label (JSON Pointer writes its slash as ~1).
        assert "podLabels/app.kubernetes.io~1name" in done.stderr, done.stderr


def test_every_container_has_resources_and_the_operator_a_readiness_probe() -> None:
    docs = rendered(WATCH, 'memory.postgres={"deploy": true}')
    for name, template in workloads(docs).items():
        for container in template["spec"]["containers"]:
            resources = container.get("resources") or {}
            where = (name, container["name"])
            assert resources.get("requests") and resources.get("limits"), where
            assert "readinessProbe" in container and "livenessProbe" in container, name
    operator = workloads(docs)["corral-operator"]["spec"]
    (container,) = operator["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080} in container["ports"]
    # The archive's claim: written by the operator's group whoever made its files.
    assert operator["securityContext"]["fsGroup"] == 10001
    assert operator["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    assert {"name": "archive", "mountPath": "/var/lib/corral/archive"} in container["volumeMounts"]


def test_two_operators_elect_a_leader_by_a_lease_they_alone_may_write() -> None:
    docs = rendered(WATCH)
    deployment = named(docs, "Deployment", "corral-operator")
    assert deployment["spec"]["replicas"] == 2
    # A rollout starts the new replica (a standby) before it stops the old (the leader).
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--leader-elect-lease=corral-system/corral-operator" in container["args"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in (
        container["env"]
    )
    # The archive's claim is ReadWriteOnce: the replicas share its node...
    (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    # ...while with the S3 archive they spread.
    s3 = rendered(WATCH, 'archive.s3={"endpoint": "https://s3.example", "bucket": "audit", '
                  '"credentialsSecret": "keys"}')  # fmt: skip
    spread = named(s3, "Deployment", "corral-operator")["spec"]["template"]["spec"]["affinity"]
    assert set(spread) == {"podAntiAffinity"}
    # The Lease's rights: create (no name can be given yet), get and update of that one only.
    role = named(docs, "Role", "corral-operator-leader")
    assert role["metadata"]["namespace"] == "corral-system"
    assert {tuple(r["verbs"]): r.get("resourceNames") for r in role["rules"]} == {
        ("create",): None,
        ("get", "update"): ["corral-operator"],
    }
    assert helm_template(WATCH, 'operator={"replicas": -1}').returncode != 0


def test_sandbox_pull_secrets_go_on_the_sandbox_service_account() -> None:
    docs = rendered(
        'watchNamespaces=["agents", "team-b"]', 'sandbox.imagePullSecrets=[{"name": "regcred"}]'
    )
    accounts = [
        d
        for d in docs
        if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "corral-sandbox"
    ]
    assert {a["metadata"]["namespace"] for a in accounts} == {"agents", "team-b"}
    for account in accounts:
        assert account["imagePullSecrets"] == [{"name": "regcred"}]
    # The chart's own pods pull with imagePullSecrets, not with the sandbox's.
    assert "imagePullSecrets" not in workloads(docs)["corral-operator"]["spec"]
    plain = named(rendered(WATCH), "ServiceAccount", "corral-sandbox")
    assert "imagePullSecrets" not in plain


def _egress_by_port(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]] | None]:
    out: dict[int, list[dict[str, Any]] | None] = {}
    for rule in policy["spec"]["egress"]:
        for port in rule["ports"]:
            out[int(port["port"])] = rule.get("to")
    return out


def test_the_operators_network_policy_admits_no_one_and_dials_what_the_operator_dials() -> None:
    policy = named(rendered(WATCH), "NetworkPolicy", "corral-operator")
    assert policy["spec"]["podSelector"] == {"matchLabels": OPERATOR_SELECTOR}
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert policy["spec"]["ingress"] == []  # no peer named: probes and port-forward only
    egress = _egress_by_port(policy)
    assert set(egress) == {443, 6443, 8080, 8082, 9091, 53}
    assert egress[443] is None and egress[6443] is None  # the API server: any address
    sandboxes = {
        "podSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "corral-operator"}},
        "namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["agents"]}]},
    }  # fmt: skip
    assert egress[8080] == egress[8082] == [sandboxes]
    assert egress[9091] == [{"podSelector": {"matchLabels": GATEWAY_SELECTOR}}]
    assert egress[53] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]


def test_the_operators_network_policy_follows_the_values() -> None:
    monitoring = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    prometheus = [{"namespaceSelector": monitoring}]
    ingress = [{"ipBlock": {"cidr": "10.0.0.0/28"}}]
    api = [{"ipBlock": {"cidr": "192.0.2.10/32"}}]
    docs = rendered(
        "watchNamespaces=[]",
        'sandboxNamespaces=["agents"]',
        f"metrics.allowedFrom={json.dumps(prometheus)}",
        f"console.allowedFrom={json.dumps(ingress)}",
        'archive.s3={"endpoint": "https://s3.example.com", "bucket": "corral-archive", '
        '"credentialsSecret": "keys"}',
        f'operator.networkPolicy={{"apiServer": {{"ports": [6443], "to": {json.dumps(api)}}}, '
        '"extraEgress": [{"ports": [{"port": 9418, "protocol": "TCP"}]}]}',
    )
    policy = named(docs, "NetworkPolicy", "corral-operator")
    by_port = {int(r["ports"][0]["port"]): r for r in policy["spec"]["ingress"]}
    assert by_port[9090]["from"] == prometheus
    assert [p["port"] for p in by_port[8090]["ports"]] == [8090, 8091]  # console, archive reader
    assert by_port[8090]["from"] == ingress
    egress = _egress_by_port(policy)
    assert egress[6443] == api and 443 in egress  # 443: the object store's https port now
    assert egress[443] is None
    assert egress[8080][0]["namespaceSelector"] == {}  # type: ignore[index]  # every namespace
    assert egress[9418] is None
    # The gateway's admin port admits the same scrapers.
    gateway = named(docs, "NetworkPolicy", "corral-egress-gateway")
    admin = [r for r in gateway["spec"]["ingress"] if r["ports"][0]["port"] == 9091]
    assert prometheus[0] in admin[0]["from"]
    # An object store on its own port, e.g. MinIO in the cluster.
    minio = rendered(
        WATCH,
        'archive.s3={"endpoint": "http://minio.storage:9000", "bucket": "corral-archive", '
        '"credentialsSecret": "keys"}',
    )
    assert 9000 in _egress_by_port(named(minio, "NetworkPolicy", "corral-operator"))
    off = rendered(WATCH, 'operator.networkPolicy={"enabled": false}')
    assert [d["metadata"]["name"] for d in off if d["kind"] == "NetworkPolicy"] == [
        "corral-egress-gateway"
    ]


def test_the_deployed_memory_database_admits_the_gateway_alone_and_reads_its_password_file() -> (
    None
):
    docs = rendered(WATCH, 'memory.postgres={"deploy": true}')
    policy = named(docs, "NetworkPolicy", "corral-memory")
    assert policy["spec"]["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": GATEWAY_SELECTOR}}],
            "ports": [{"port": 5432, "protocol": "TCP"}],
        }
    ]
    assert policy["spec"]["egress"] == []
    pod = workloads(docs)["corral-memory"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert "POSTGRES_PASSWORD" not in env
    assert env["POSTGRES_PASSWORD_FILE"]["value"] == "/etc/corral/memory-password/password"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/postgresql/data", "/var/run/postgresql", "/tmp"} <= mounts


def test_model_providers_reach_the_operator_and_a_bad_entry_is_refused_at_install() -> None:
    providers = (
        'modelProviders=[{"name": "bedrock-us", "type": "bedrock", "region": "us-east-1"}, '
        '{"name": "gw", "type": "gateway", "baseUrl": "https://llm.example", '
        '"authHeader": "authorization", "authScheme": "Bearer", "default": true}]'
    )
    docs = rendered(WATCH, providers)
    configmap = named(docs, "ConfigMap", "corral-model-providers")
    assert configmap["metadata"]["namespace"] == "corral-system"
    listed = json.loads(configmap["data"]["providers.json"])
    assert [p["name"] for p in listed] == ["bedrock-us", "gw"]
    pod = named(docs, "Deployment", "corral-operator")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--model-providers-file=/etc/corral/model-providers/providers.json" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["model-providers"] == "/etc/corral/model-providers"
    # The operator reads what the chart wrote, as it reads it at start.
    from corral_api.providers import load_providers

    assert [p.type for p in load_providers(configmap["data"]["providers.json"], "cm")] == [
        "bedrock", "gateway",
    ]  # fmt: skip
    # None listed: no ConfigMap, no flag (the implicit anthropic provider).
    plain = rendered(WATCH)
    assert not [d for d in plain if d["metadata"]["name"] == "corral-model-providers"]
    # The values schema refuses what no provider can be, with the field's name.
    for bad in (
        'modelProviders=[{"name": "x", "type": "openai"}]',
        'modelProviders=[{"name": "x", "type": "bedrock", "regin": "us-east-1"}]',
    ):
        done = helm_template(WATCH, bad)
        assert done.returncode != 0 and "modelProviders" in done.stderr, done.stderr
