"""`corral version` against the real local API server: the client's version, the versions each
Corral CRD serves and stores (read from the CRD objects installed from crds/), and the
operator's image from its Deployment; an identity that may read none of it still gets the
client's version and a line that says why, exit 0 (docs/cli.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from corral_dev.controlplane import ControlPlane

CORRAL = [sys.executable, "-c", "import sys; from corral_cli.main import main; sys.exit(main())"]
KINDS = ("agents", "sessions", "goals", "evidences", "approvals", "freezes")


def corral(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CORRAL, *args, "--kubeconfig", str(kubeconfig)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def _operator(namespace: str) -> dict[str, object]:
    """An operator Deployment as the chart labels it (no node runs its pod: only its spec is
    read)."""
    labels = {"app.kubernetes.io/name": "corral-operator", "app.kubernetes.io/version": "9.9.9"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "corral-operator", "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "corral-operator"}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "corral-operator"}},
                "spec": {"containers": [{"name": "operator",
                                         "image": "registry.example/corral-operator:9.9.9"}]},
            },
        },
    }  # fmt: skip


def test_version_reads_the_crds_and_the_operator(
    control_plane: ControlPlane, namespace: str
) -> None:
    control_plane.apply_object(_operator(namespace))
    done = corral(control_plane.kubeconfig, "version", "--operator-namespace", namespace)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"Client Version: corral {version('corral')}"
    assert lines[1].startswith(f"Server: {control_plane.server} (Kubernetes v1.")
    for kind in KINDS:
        line = f"CRD {kind}.corral.dev: served v1alpha1, storage v1alpha1, stored v1alpha1"
        assert line in lines, done.stdout
    assert (
        f"Operator: {namespace}/corral-operator image registry.example/corral-operator:9.9.9 "
        "version 9.9.9 (ready 0/1)"
    ) in lines

    as_json = json.loads(corral(control_plane.kubeconfig, "version", "-o", "json").stdout)
    assert as_json["client"]["version"] == version("corral")
    assert as_json["server"]["crds"]["sessions.corral.dev"]["storage"] == "v1alpha1"
    assert as_json["server"]["operator"]["error"] == "no operator Deployment in namespace " \
        "corral-system"  # fmt: skip


def test_version_for_an_identity_that_may_read_nothing_still_exits_0(
    control_plane: ControlPlane,
) -> None:
    nobody = control_plane.user_kubeconfig("nobody-reads-crds")
    done = corral(nobody, "version")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Client Version: corral ")
    # RBAC on CRDs is cluster-wide: one refusal, said once.
    (crds,) = [line for line in lines if line.startswith("CRD")]
    assert crds.startswith("CRDs: ") and "403" in crds and "forbidden" in crds, crds
    assert any(line.startswith("Operator: ") and "403" in line for line in lines), lines
