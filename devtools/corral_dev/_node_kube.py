"""The local node's way to the API server: corral_kube's client from the node's kubeconfig,
with the kubelet's patience (30 s a request; a watch waits its own timeout)."""

from __future__ import annotations

from pathlib import Path

from corral_kube import KubeClient, load_kubeconfig

REQUEST_TIMEOUT = 30.0


def node_kube(kubeconfig: Path) -> KubeClient:
    return KubeClient(load_kubeconfig(kubeconfig), timeout=REQUEST_TIMEOUT)
