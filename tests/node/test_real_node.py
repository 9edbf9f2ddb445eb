"""Real containers on the real node: a pod from the locally built base image runs to
completion with readable logs, gets an address in 198.18.0.0/15, resolves names through CoreDNS
and reaches the API server through the `kubernetes` Service; NetworkPolicy is enforced."""

from __future__ import annotations

import ipaddress
import json
import time

import pytest

from corral_dev import realnode
from corral_dev.controlplane import ControlPlane

from . import _pods
from ._host import host_iptables_rules

pytestmark = pytest.mark.timeout(240)

BENCHMARK_RANGE = ipaddress.ip_network("198.18.0.0/15")


def base(node: realnode.RealNode) -> str:
    return node.artifacts["BASE_IMAGE"]


def test_pod_completes_and_its_logs_are_readable(
    node_plane: ControlPlane, real_node: realnode.RealNode, node_namespace: str
) -> None:
    manifest = _pods.pod(
        "hello",
        node_namespace,
        base(real_node),
        ["sh", "-c", "echo hello from uid $(id -u) on $(hostname)"],
    )
    phase, logs = _pods.run_to_end(node_plane, manifest)
    assert phase == "Succeeded", logs
    assert logs.strip() == f"hello from uid {_pods.NONROOT} on hello"
    status = _pods.get(node_plane, node_namespace, "hello")
    assert status["spec"]["nodeName"] == real_node.name
    terminated = status["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "Completed" and terminated["exitCode"] == 0
    # The container really ran under containerd: its id is a containerd one.
    assert status["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")


def test_pod_address_is_in_the_benchmark_range(
    node_plane: ControlPlane, real_node: realnode.RealNode, node_namespace: str
) -> None:
    manifest = _pods.pod(
        "addr",
        node_namespace,
        base(real_node),
        ["sh", "-c", "cat /proc/net/fib_trie | grep -q 198.18 && sleep 1"],
    )
    phase, logs = _pods.run_to_end(node_plane, manifest)
    assert phase == "Succeeded", logs
    status = _pods.get(node_plane, node_namespace, "addr")["status"]
    ip = ipaddress.ip_address(status["podIP"])
    assert ip in BENCHMARK_RANGE
    assert ip in ipaddress.ip_network(real_node.addrs.pod_cidr)


RESOLVE_AND_CALL = r"""
import json, socket, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
addr = socket.gethostbyname("kubernetes.default")
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
req = urllib.request.Request(
    "https://kubernetes.default.svc/api",
    headers={"Authorization": "Bearer " + open(f"{sa}/token").read().strip()},
)
with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
    body = json.load(resp)
print(json.dumps({"addr": addr, "status": resp.status, "kind": body.get("kind")}))
"""


def test_dns_resolves_the_api_service_and_the_pod_reaches_it(
    node_plane: ControlPlane, real_node: realnode.RealNode, node_namespace: str
) -> None:
    manifest = _pods.pod(
        "dns", node_namespace, base(real_node), ["python3", "-c", RESOLVE_AND_CALL], token=True
    )
    phase, logs = _pods.run_to_end(node_plane, manifest)
    assert phase == "Succeeded", logs
    result = json.loads(logs.strip().splitlines()[-1])
    cluster_ip = node_plane.kubectl(
        "get", "service", "kubernetes", "-n", "default", "-o", "jsonpath={.spec.clusterIP}"
    ).stdout.strip()
    assert result == {"addr": cluster_ip, "status": 200, "kind": "APIVersions"}
    assert ipaddress.ip_address(cluster_ip) in BENCHMARK_RANGE


def test_a_name_outside_the_cluster_does_not_resolve(
    node_plane: ControlPlane, real_node: realnode.RealNode, node_namespace: str
) -> None:
    script = (
        "import socket\n"
        "try:\n    socket.gethostbyname('deb.debian.org'); print('resolved')\n"
        "except OSError as e:\n    print('unresolved', e)\n"
    )
    manifest = _pods.pod("nodns", node_namespace, base(real_node), ["python3", "-c", script])
    phase, logs = _pods.run_to_end(node_plane, manifest)
    assert phase == "Succeeded", logs
    assert logs.startswith("unresolved"), logs


# ------------------------------------------------------------------------- NetworkPolicy

SERVE = (
    "import http.server as h\n"
    "h.ThreadingHTTPServer(('', 8080), h.SimpleHTTPRequestHandler).serve_forever()\n"
)
PROBE = (
    "import sys, urllib.request\n"
    "try:\n"
    "    urllib.request.urlopen(sys.argv[1], timeout=2).read(); print('reached')\n"
    "except Exception as e:\n"
    "    print('blocked', type(e).__name__)\n"
)


def _probe(plane: ControlPlane, namespace: str, client: str, url: str) -> str:
    done = plane.kubectl(
        "exec", client, "-n", namespace, "--", "python3", "-c", PROBE, url, timeout=30
    )
    return done.stdout.strip()


def _eventually(
    plane: ControlPlane, namespace: str, client: str, url: str, want: str, timeout: float = 30
) -> str:
    """Probe until the answer starts with `want` (policies apply asynchronously), then twice
    more to see it hold; returns the last answer."""
    deadline = time.monotonic() + timeout
    answer = ""
    while time.monotonic() < deadline:
        answer = _probe(plane, namespace, client, url)
        if answer.startswith(want):
            for _ in range(2):
                answer = _probe(plane, namespace, client, url)
                assert answer.startswith(want), f"{want!r} did not hold: {answer}"
            return answer
        time.sleep(0.5)
    raise AssertionError(f"{client} -> {url}: wanted {want!r}, last answer {answer!r}")


def _policy(name: str, namespace: str, egress: list[dict[str, object]]) -> str:
    return json.dumps(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "podSelector": {"matchLabels": {"role": "client"}},
                "policyTypes": ["Egress"],
                "egress": egress,
            },
        }
    )


def test_network_policy_denies_then_allows_pod_to_pod_egress(
    node_plane: ControlPlane, real_node: realnode.RealNode, node_namespace: str
) -> None:
    ns, image = node_namespace, base(real_node)
    _pods.create(
        node_plane,
        _pods.pod("server", ns, image, ["python3", "-c", SERVE], labels={"role": "server"}),
    )
    _pods.create(
        node_plane, _pods.pod("client", ns, image, ["sleep", "infinity"], labels={"role": "client"})
    )
    _pods.create(
        node_plane, _pods.pod("other", ns, image, ["sleep", "infinity"], labels={"role": "other"})
    )
    for name in ("server", "client", "other"):
        _pods.wait_ready(node_plane, ns, name)
    server_ip = _pods.get(node_plane, ns, "server")["status"]["podIP"]
    url = f"http://{server_ip}:8080/"

    # No policy: both reach the server.
    assert _probe(node_plane, ns, "client", url).startswith("reached")
    assert _probe(node_plane, ns, "other", url).startswith("reached")

    # A policy selecting the client with no egress rule: the client is cut off, the pod the
    # policy does not select is not.
    node_plane.kubectl("apply", "-f", "-", input=_policy("deny-egress", ns, []))
    _eventually(node_plane, ns, "client", url, "blocked")
    assert _probe(node_plane, ns, "other", url).startswith("reached")

    # An allowing policy (policies add up): egress to the server pods on 8080 only.
    allow = [
        {
            "to": [{"podSelector": {"matchLabels": {"role": "server"}}}],
            "ports": [{"protocol": "TCP", "port": 8080}],
        }
    ]
    node_plane.kubectl("apply", "-f", "-", input=_policy("allow-server", ns, allow))
    _eventually(node_plane, ns, "client", url, "reached")
    # ...and still not to the other pod (which serves nothing, but the SYN must not leave).
    node_plane.kubectl("delete", "networkpolicy", "allow-server", "-n", ns)
    _eventually(node_plane, ns, "client", url, "blocked")


# ------------------------------------------------------------------ the host stays clean


def test_node_rules_live_in_its_own_namespace(
    real_node: realnode.RealNode, host_rules_before: set[str]
) -> None:
    """kube-proxy's, the kubelet's and kube-router's iptables rules are in the node's
    network namespace; this host's rules are as they were before the node started."""
    added = host_iptables_rules() - host_rules_before
    assert not added, f"the node added rules to this host: {sorted(added)[:20]}"
    done = real_node.in_netns("iptables-save")
    assert done.returncode == 0, done.stderr
    for chain in (":KUBE-SERVICES", ":KUBE-ROUTER-FORWARD", ":KUBE-KUBELET-CANARY"):
        assert chain in done.stdout, f"{chain} not in the node's namespace"
    # No default route out of the node's namespace: pods reach the node, each other and this
    # host's end of the link, nothing beyond.
    routes = real_node.in_netns("ip", "route", "show", "default")
    assert routes.returncode == 0 and routes.stdout.strip() == ""
