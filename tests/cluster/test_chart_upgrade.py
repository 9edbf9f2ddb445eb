"""The chart installed and upgraded for real, with helm alone, on a control plane of its own (the
CRDs are cluster-wide: the tier's shared plane must keep the current ones throughout).

Helm installs a chart's crds/ once and never changes them, so docs/operations.md ("Upgrade")
has people apply the new CRDs server-side before `helm upgrade`. Here the chart of an older
commit is installed (its CRDs predate Session.status.egress), a Session is created under them,
the current chart is upgraded over it (the CRDs stay old: the new field is pruned), then the
documented command applies the new CRDs: the Session still reads, and the new field is kept.
The chart's Kubernetes version check is run against the real API server too."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral_dev import controlplane
from corral_dev._realnode_stack import CHART

pytestmark = pytest.mark.timeout(240)

REPO = CHART.parent.parent
# The CRDs' revision before the current one: Session.status.egress came after it.
PREVIOUS_CRDS = "c394ae8dbf8fa7d58555909cc5635433bf3c0ce6"
NAMESPACE = "agents"
RELEASE = "corral"
UPGRADE = ["kubectl", "apply", "--server-side", "--force-conflicts", "-f", "charts/corral/crds/"]


@pytest.fixture(scope="module")
def plane() -> Iterator[controlplane.ControlPlane]:
    state = Path(tempfile.mkdtemp(prefix="corral-chart-upgrade-"))
    # No controller manager: nothing here needs a pod to run, only the API server to store.
    cp = controlplane.start(state, controller_manager=False)
    try:
        cp.kubectl("create", "namespace", NAMESPACE)
        yield cp
    finally:
        cp.stop()
        shutil.rmtree(state, ignore_errors=True)


def _chart_at(commit: str, into: Path) -> Path:
    """The chart as it was at `commit`, from the archive kept beside this test (made with
    `git archive --format=tar.gz -o tests/cluster/data/chart-<short>.tar.gz <commit>
    charts/corral`), so a shallow clone runs the test too."""
    archive = Path(__file__).parent / "data" / f"chart-{commit[:7]}.tar.gz"
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "charts" / "corral"


def _helm(cp: controlplane.ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cp.bin_dir / "helm"), *args, "--kubeconfig", str(cp.kubeconfig)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _install(cp: controlplane.ControlPlane, verb: str, chart: Path) -> str:
    """The documented install: the release namespace created by helm, watchNamespaces alone."""
    done = _helm(
        cp, verb, RELEASE, str(chart), "--namespace", "corral-system", "--create-namespace",
        "--set-json", f'watchNamespaces=["{NAMESPACE}"]',
    )  # fmt: skip
    assert done.returncode == 0, f"helm {verb}: {done.stderr}"
    return done.stdout


def _session(cp: controlplane.ControlPlane) -> dict[str, Any]:
    got = cp.kubectl("get", "session", "fix-bug", "-n", NAMESPACE, "-o", "json")
    return dict(json.loads(got.stdout))


def _write_egress_status(cp: controlplane.ControlPlane) -> dict[str, Any]:
    """What the operator writes since the CRDs gained status.egress, then the Session read back."""
    patch = {"status": {"egress": {"allowed": 3, "denied": 1, "moreHosts": 0}}}
    cp.kubectl(
        "patch", "session", "fix-bug", "-n", NAMESPACE, "--subresource=status",
        "--type=merge", "-p", json.dumps(patch),
    )  # fmt: skip
    return _session(cp)


def _crd_has_egress(cp: controlplane.ControlPlane) -> bool:
    crd = json.loads(cp.kubectl("get", "crd", "sessions.corral.dev", "-o", "json").stdout)
    (version,) = crd["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    return "egress" in status


def test_an_install_of_the_previous_crds_upgrades_the_documented_way(
    plane: controlplane.ControlPlane, tmp_path: Path
) -> None:
    _install(plane, "install", _chart_at(PREVIOUS_CRDS, tmp_path))
    assert not _crd_has_egress(plane)
    plane.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": "corral.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "coder"},
         "spec": {"identity": "You write code.", "model": "claude-test"}},
        {"apiVersion": "corral.dev/v1alpha1", "kind": "Session", "metadata": {"name": "fix-bug"},
         "spec": {"agentRef": "coder", "task": "Fix the bug.",
                  "workspace": {"repo": "https://git.example/repo.git", "ref": "main"}}},
    ]))  # fmt: skip
    before = _session(plane)

    notes = _install(plane, "upgrade", CHART)
    # The release's NOTES say what to do next, the CRD step included.
    assert "kubectl apply --server-side --force-conflicts -f charts/corral/crds/" in notes
    assert f"kubectl -n {NAMESPACE} get sessions -w" in notes
    # helm upgrade left the CRDs as they were: the new status field is pruned on write.
    assert not _crd_has_egress(plane)
    assert "egress" not in _write_egress_status(plane).get("status", {})

    kubectl = [str(plane.bin_dir / UPGRADE[0]), "--kubeconfig", str(plane.kubeconfig)]
    # Without --force-conflicts the apply stops: helm's install owns the CRDs' fields.
    unforced = [arg for arg in UPGRADE[1:] if arg != "--force-conflicts"]
    conflict = subprocess.run(
        [*kubectl, *unforced], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert conflict.returncode != 0 and 'conflict with "helm"' in conflict.stderr, conflict.stderr
    done = subprocess.run(
        [*kubectl, *UPGRADE[1:]], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    assert _crd_has_egress(plane)
    after = _write_egress_status(plane)
    # The Session created under the old CRDs reads as it was, and takes the new field.
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["spec"] == before["spec"]
    assert after["status"]["egress"]["allowed"] == 3 and after["status"]["egress"]["denied"] == 1
    # The documented command is the one docs/operations.md and the chart's README give.
    command = " ".join(UPGRADE)
    assert command in (REPO / "docs" / "operations.md").read_text()
    assert command in (CHART / "README.md").read_text()


def test_the_version_check_asks_the_cluster_at_install(
    plane: controlplane.ControlPlane, tmp_path: Path
) -> None:
    """A chart whose minimum is above the API server's version: refused where a cluster
    answers (`--dry-run=server` renders as an install does), rendered by `helm template`."""
    chart = tmp_path / "corral"
    shutil.copytree(CHART, chart)
    helpers = chart / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    assert '{{- define "corral.minKubeVersion" -}}1.33.0{{- end }}' in text
    helpers.write_text(text.replace("-}}1.33.0{{-", "-}}1.99.0{{-"))
    refused = _helm(
        plane, "install", "probe", str(chart), "--namespace", "probe", "--dry-run=server",
        "--set-json", f'watchNamespaces=["{NAMESPACE}"]',
    )  # fmt: skip
    assert refused.returncode != 0
    assert "this cluster runs Kubernetes v1.34" in refused.stderr, refused.stderr
    assert "needs 1.99.0 or later" in refused.stderr, refused.stderr
    offline = subprocess.run(
        [str(plane.bin_dir / "helm"), "template", "probe", str(chart),
         "--set-json", f'watchNamespaces=["{NAMESPACE}"]'],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert offline.returncode == 0, offline.stderr
