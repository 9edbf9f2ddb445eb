"""The cluster the node tier's Corral tests run against: the real node here, or another
cluster of real containers named by the environment (kind, from hack/e2e-kind.sh).

    CORRAL_E2E_KUBECONFIG       an admin kubeconfig of that cluster: selects it (KUBECONFIG
                                alone never does, so a person's own cluster is not used by
                                accident)
    CORRAL_E2E_OPERATOR_IMAGE   the operator image, already on the cluster's nodes
    CORRAL_E2E_SANDBOX_IMAGE    the sandbox image, already on the cluster's nodes
    CORRAL_E2E_HOST_IP          this host's address as the cluster's pods reach it (the git
                                daemon and the scripted model listen there)

kubectl and helm are the control plane's pinned builds (hack/build-control-plane.sh).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

E2E_VARIABLES = (
    "CORRAL_E2E_KUBECONFIG",
    "CORRAL_E2E_OPERATOR_IMAGE",
    "CORRAL_E2E_SANDBOX_IMAGE",
    "CORRAL_E2E_HOST_IP",
)


def external_requested() -> bool:
    return bool(os.environ.get("CORRAL_E2E_KUBECONFIG"))


@dataclass(frozen=True)
class Target:
    name: str
    kubeconfig: Path
    bin_dir: Path
    host_ip: str  # this host, as pods reach it
    operator_image: str
    sandbox_image: str

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        done = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(
                done.returncode, done.args, output=done.stdout, stderr=done.stderr
            )
        return done

    @property
    def helm(self) -> Path:
        return self.bin_dir / "helm"


def external(bin_dir: Path) -> Target:
    """The cluster the environment names; ValueError naming what is missing."""
    missing = [v for v in E2E_VARIABLES if not os.environ.get(v)]
    if missing:
        raise ValueError(f"CORRAL_E2E_KUBECONFIG is set but not {', '.join(missing)}")
    return Target(
        name="external",
        kubeconfig=Path(os.environ["CORRAL_E2E_KUBECONFIG"]),
        bin_dir=bin_dir,
        host_ip=os.environ["CORRAL_E2E_HOST_IP"],
        operator_image=os.environ["CORRAL_E2E_OPERATOR_IMAGE"],
        sandbox_image=os.environ["CORRAL_E2E_SANDBOX_IMAGE"],
    )
