"""The operator reads the egress gateway from its Service at start (--egress-gateway-service),
against the real kube-apiserver: the clusterIP the API server allocated, the `proxy` and
`admin` ports, the selector of its pods; a Service that cannot be it, or none, stops the start
with a reason."""

from __future__ import annotations

import asyncio

import pytest

from corral_dev.controlplane import ControlPlane
from corral_operator.kube import Kube
from corral_operator.main import gateway_of_service
from corral_operator.settings import GatewayServiceError

pytestmark = pytest.mark.timeout(60)


def _service(namespace: str, name: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"app.kubernetes.io/name": "corral-egress-gateway"},
            "ports": [
                {"name": "proxy", "port": 3128, "targetPort": 3128},
                {"name": "admin", "port": 9091, "targetPort": 9091},
            ],
            **spec,
        },
    }


def test_the_gateway_is_what_its_service_says(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.apply_object(_service(namespace, "corral-egress-gateway"))
    control_plane.apply_object(_service(namespace, "headless", clusterIP="None"))
    allocated = control_plane.kubectl(
        "get", "service", "corral-egress-gateway", "-n", namespace,
        "-o", "jsonpath={.spec.clusterIP}",
    ).stdout.strip()  # fmt: skip

    async def read() -> None:
        kube = await Kube.connect(str(control_plane.kubeconfig))
        try:
            gateway = await gateway_of_service(kube, (namespace, "corral-egress-gateway"))
            assert (gateway.address, gateway.port, gateway.admin_port) == (allocated, 3128, 9091)
            assert gateway.namespace == namespace and gateway.policy_port == 3128
            assert gateway.pod_labels == {"app.kubernetes.io/name": "corral-egress-gateway"}
            with pytest.raises(GatewayServiceError, match="no clusterIP"):
                await gateway_of_service(kube, (namespace, "headless"))
            with pytest.raises(GatewayServiceError, match="does not exist"):
                await gateway_of_service(kube, (namespace, "missing"), attempts=2, pause=0.1)
        finally:
            await kube.close()

    asyncio.run(read())
