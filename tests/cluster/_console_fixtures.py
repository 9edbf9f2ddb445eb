"""Fixtures for the console's cluster and browser tests (this module holds no tests).

The console runs where the chart runs it: a listener of the real `corral-operator` process,
under the chart's RBAC (the operator's identity plus the console's two reviews). People are
ServiceAccounts with tokens from the API server's TokenRequest, bound to the chart's
`<release>-viewer` and `<release>-approver` roles in one namespace each.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from corral_dev import controlplane, stack
from corral_dev.controlplane import ControlPlane

from ._operator_fixtures import OperatorHandle


@dataclass
class ConsoleHandle:
    url: str
    namespace: str  # where the operator runs Sessions; alice reads and decides here
    other: str  # another namespace; mallory reads there and nowhere else
    alice: str  # bearer tokens
    mallory: str

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def person_token(cp: ControlPlane, namespace: str, name: str, *roles: str) -> str:
    """A ServiceAccount `name` in `namespace` with each ClusterRole bound there, and a token
    the API server issued for it (TokenRequest)."""
    cp.kubectl("create", "serviceaccount", name, "-n", namespace, check=False)
    for role in roles:
        cp.kubectl(
            "create", "rolebinding", f"{name}-{role}", "-n", namespace,
            f"--clusterrole={role}", f"--serviceaccount={namespace}:{name}", check=False,
        )  # fmt: skip
    done = cp.kubectl("create", "token", name, "-n", namespace, "--duration=1h")
    return done.stdout.strip()


@pytest.fixture
def other_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"o{os.getpid()}-{int(time.monotonic() * 1000) % 100000}"
    control_plane.create_namespace(name)
    controlplane.wait_for_default_service_account(control_plane, name)
    yield name
    control_plane.release_namespace(name)


@pytest.fixture
def console(
    operator: OperatorHandle, control_plane: ControlPlane, other_namespace: str
) -> ConsoleHandle:
    """The operator restarted to serve two namespaces and its console on a free port, and two
    people: alice reads and decides in the operator's namespace, mallory reads the other."""
    port = controlplane.free_port()
    operator.stop()
    release = f"corral-{operator.namespace}"  # the operator fixture's rendering of the chart
    stack.install_rbac(control_plane, release, [operator.namespace, other_namespace])
    operator.args += ["--namespace", other_namespace, "--console-addr", f"127.0.0.1:{port}"]
    operator.start()
    url = f"http://127.0.0.1:{port}"
    stack.wait_serving("the console", f"{url}/healthz", operator.process, operator.log)
    return ConsoleHandle(
        url=url,
        namespace=operator.namespace,
        other=other_namespace,
        alice=person_token(
            control_plane, operator.namespace, "alice", f"{release}-viewer", f"{release}-approver"
        ),
        mallory=person_token(control_plane, other_namespace, "mallory", f"{release}-viewer"),
    )
