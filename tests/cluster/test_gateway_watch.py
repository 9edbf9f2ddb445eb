"""corral-gateway's pod watch against the real kube-apiserver.

The gateway runs as a ServiceAccount that may only get, list and watch the namespace's pods
(its token from the TokenRequest API, as a projected token would be). No kubelet runs here, so
the test writes each pod's status itself through the pods/status subresource: phase Running
and a podIP, a loopback address a test client then connects from.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral_dev.controlplane import ControlPlane

from ..wire._gateway import Destination, Gateway, binding, connect, serve, start_gateway

pytestmark = pytest.mark.timeout(90)

POD_IP = "127.0.0.30"
OTHER_IP = "127.0.0.31"
UNLABELLED_IP = "127.0.0.32"
WEB_IP = "127.0.0.4"
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def gateway_token(plane: ControlPlane, namespace: str, work: Path) -> Path:
    """A ServiceAccount that reads pods and nothing else, and a token for it."""
    meta = {"name": "egress-gateway", "namespace": namespace}
    plane.apply_object({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta})
    plane.apply_object(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            ],
        }
    )
    plane.apply_object(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": meta["name"],
            },
            "subjects": [{"kind": "ServiceAccount", **meta}],
        }
    )
    answer = plane.api_send(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/egress-gateway/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    assert answer is not None
    path = work / "token"
    path.write_text(answer["status"]["token"])
    return path


def pod(
    name: str, namespace: str, session: str, agent: str, rules: list[dict[str, Any]], *,
    labelled: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """A sandbox pod as the operator labels and annotates it."""
    annotation = binding(namespace=namespace, session=session, agent=agent, agent_rules=rules)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {"corral.dev/egress": "gateway"} if labelled else {},
        "annotations": {"corral.dev/egress-binding": json.dumps(annotation)},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            # No node may take it: the cluster tier's local node (when another test started
            # it) would run the pod and write a status of its own over the test's.
            "nodeSelector": {"corral.dev/no-node": "for-this-test"},
            "containers": [
                {"name": "tools", "image": "corral/ignored:latest", "securityContext": RESTRICTED}
            ],
        },
    }


def set_status(plane: ControlPlane, namespace: str, name: str, phase: str, ip: str) -> None:
    """What a kubelet would write: the phase and the pod's address."""
    plane.api_send(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        {"status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]}},
        "application/merge-patch+json",
    )


def ready(plane: ControlPlane, namespace: str, name: str) -> None:
    """The kubelet's Ready condition (a gateway replica the Service sends connections to)."""
    plane.api_send(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        "application/merge-patch+json",
    )


def delete(plane: ControlPlane, namespace: str, name: str) -> None:
    plane.api_send(
        "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", {"gracePeriodSeconds": 0}
    )


def eventually(check: Callable[[], bool], what: str, limit: float = 10) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def bound_uid(gateway: Gateway, ip: str) -> str | None:
    answer = gateway.admin_get(f"/v1/bindings?ip={ip}")
    return str(answer.json()["uid"]) if answer.status_code == 200 else None


@pytest.fixture
def web() -> Iterator[Destination]:
    server = serve(WEB_IP)
    yield server
    server.stop()


def test_watch_binds_running_pods_and_a_reused_address_gets_only_its_own_rules(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, web: Destination
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{WEB_IP} first.test second.test\n")
    token = gateway_token(control_plane, namespace, tmp_path)
    gateway = start_gateway(
        tmp_path,
        [
            "--kube-api", control_plane.server,
            "--kube-token-file", str(token),
            "--kube-ca-file", str(control_plane.ca_file),
            "--namespace", namespace,
            "--hosts-file", str(hosts),
            "--allow-range", f"{WEB_IP}/32",
        ],
    )  # fmt: skip
    try:
        first_rules = [{"host": "first.test", "ports": [web.port]}]
        first = control_plane.apply_object(pod("first", namespace, "s1", "coder", first_rules))
        # Pending (no address yet): unknown.
        time.sleep(0.3)
        assert bound_uid(gateway, POD_IP) is None
        set_status(control_plane, namespace, "first", "Running", POD_IP)
        eventually(lambda: bound_uid(gateway, POD_IP) == first["metadata"]["uid"], "first bound")
        assert connect(gateway.proxy_port, POD_IP, f"first.test:{web.port}").status == 200

        # A pod that has ended, or is not labelled, is unknown. (A Pending pod with an address
        # is bound: its init containers, the checkout, run then.)
        control_plane.apply_object(pod("ended", namespace, "s2", "coder", first_rules))
        set_status(control_plane, namespace, "ended", "Failed", OTHER_IP)
        plain = pod("plain", namespace, "s3", "coder", first_rules, labelled=False)
        control_plane.apply_object(plain)
        set_status(control_plane, namespace, "plain", "Running", UNLABELLED_IP)
        time.sleep(0.5)
        for ip in (OTHER_IP, UNLABELLED_IP):
            assert bound_uid(gateway, ip) is None
            refused = connect(gateway.proxy_port, ip, f"first.test:{web.port}")
            assert refused.headers["x-corral-egress-reason"] == "unknown-source"

        # Deleted: dropped. A new pod on the reused address gets its own rules only.
        delete(control_plane, namespace, "first")
        eventually(lambda: bound_uid(gateway, POD_IP) is None, "first dropped on delete")
        assert connect(gateway.proxy_port, POD_IP, f"first.test:{web.port}").status == 403
        second_rules = [{"host": "second.test", "ports": [web.port]}]
        second = control_plane.apply_object(
            pod("second", namespace, "s4", "reviewer", second_rules)
        )
        set_status(control_plane, namespace, "second", "Running", POD_IP)
        eventually(lambda: bound_uid(gateway, POD_IP) == second["metadata"]["uid"], "second bound")
        old = connect(gateway.proxy_port, POD_IP, f"first.test:{web.port}")
        assert old.status == 403 and '"reviewer"' in old.reason
        assert connect(gateway.proxy_port, POD_IP, f"second.test:{web.port}").status == 200

        # No longer Running: dropped.
        set_status(control_plane, namespace, "second", "Succeeded", POD_IP)
        eventually(lambda: bound_uid(gateway, POD_IP) is None, "second dropped when it stopped")

        report = gateway.admin_get(f"/v1/egress?namespace={namespace}&session=s1").json()
        assert [(h["host"], h["decision"]) for h in report["hosts"]] == [("first.test", "allowed")]
        assert "corral_gateway_watch_restarts_total" in gateway.admin_get("/metrics").text
    finally:
        gateway.stop()


def test_an_adoption_waits_until_every_replica_knows_the_new_binding(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """`egressrecords.await_binding`, as a warm pod's adoption calls it: the replicas are read
    from the API (a gateway pod whose address and admin port are the gateway process's), and
    each must map the address to the pod under the binding text with the given SHA-256."""
    from corral_operator.egressrecords import await_binding
    from corral_operator.kube import Kube
    from corral_operator.settings import EgressGateway

    token = gateway_token(control_plane, namespace, tmp_path)
    gateway = start_gateway(
        tmp_path,
        [
            "--kube-api", control_plane.server,
            "--kube-token-file", str(token),
            "--kube-ca-file", str(control_plane.ca_file),
            "--namespace", namespace,
        ],
    )  # fmt: skip
    replica = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gateway-0", "namespace": namespace, "labels": {"app": "gw"}},
        "spec": {
            "nodeSelector": {"corral.dev/no-node": "for-this-test"},
            "containers": [
                {
                    "name": "gateway",
                    "image": "corral/ignored:latest",
                    "securityContext": RESTRICTED,
                    "ports": [{"name": "admin", "containerPort": gateway.admin_port}],
                }
            ],
        },
    }
    settings = EgressGateway(
        address="198.18.0.10", port=3128, namespace=namespace, pod_labels={"app": "gw"}
    )

    def digest(manifest: dict[str, Any]) -> str:
        text = manifest["metadata"]["annotations"]["corral.dev/egress-binding"]
        return hashlib.sha256(text.encode()).hexdigest()

    async def wait(uid: str, sha: str, timeout: float) -> str | None:
        kube = await Kube.connect(str(control_plane.kubeconfig))
        try:
            return await await_binding(kube, settings, POD_IP, uid, sha, timeout=timeout)
        finally:
            await kube.close()

    try:
        claimed = pod("warm", namespace, "s1", "coder", [])
        sandbox = control_plane.apply_object(claimed)
        uid = sandbox["metadata"]["uid"]
        set_status(control_plane, namespace, "warm", "Running", POD_IP)
        # No replica runs yet: the wait says so rather than passing.
        assert "no replica" in (asyncio.run(wait(uid, digest(claimed), 0.3)) or "")
        control_plane.apply_object(replica)
        set_status(control_plane, namespace, "gateway-0", "Running", "127.0.0.1")
        # Running but not Ready: the Service sends it nothing, so it is not waited for.
        assert "no replica" in (asyncio.run(wait(uid, digest(claimed), 0.3)) or "")
        ready(control_plane, namespace, "gateway-0")
        # A second replica that is not Ready (starting, or leaving after a scale-down) and
        # answers nowhere does not hold the adoption up.
        unready = json.loads(json.dumps(replica))
        unready["metadata"]["name"] = "gateway-1"
        control_plane.apply_object(unready)
        set_status(control_plane, namespace, "gateway-1", "Running", "127.0.0.99")
        assert asyncio.run(wait(uid, digest(claimed), 10)) is None

        # Bound again (the checkout's rule gone): the old digest no longer holds, the new one does.
        rebound = pod("warm", namespace, "s1", "coder", [{"host": "pypi.org", "ports": []}])
        control_plane.api_send(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/warm",
            {"metadata": {"annotations": rebound["metadata"]["annotations"]}},
            "application/merge-patch+json",
        )
        assert asyncio.run(wait(uid, digest(rebound), 10)) is None
        stale = asyncio.run(wait(uid, digest(claimed), 0.3))
        assert stale is not None and "gateway-0" in stale
        # Another pod's uid on the address is not this pod's binding.
        assert asyncio.run(wait("another-uid", digest(rebound), 0.3)) is not None
    finally:
        gateway.stop()
