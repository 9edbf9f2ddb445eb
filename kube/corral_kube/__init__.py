"""Corral's one Kubernetes client: JSON by path over httpx, from a kubeconfig or the pod's
service account (ADR 0101). The operator, the custodian, the CLI and the local node use it;
it knows no Corral kind.

    from corral_kube import KubeClient, load_kubeconfig, NotFound

    client = KubeClient(load_kubeconfig())
    pod = await client.get("/api/v1/namespaces/default/pods/p")  # None when there is none

Every failure is one of these, never an httpx error:

    KubeError(message)
    ├── KubeConfigError      no usable kubeconfig, token file or exec plugin (nothing sent)
    ├── KubeUnreachable      transport: connect, TLS, timeout, a watch stream cut short
    └── KubeRefused(status, message, reason)     the API server answered an error status
        ├── Unauthorized     401
        ├── Forbidden        403
        ├── NotFound         404
        ├── Conflict         409 (AlreadyExists, or a stale resourceVersion)
        └── Gone             410 (a watch's resourceVersion expired: list again)
"""

from ._client import JSON, MERGE_PATCH, KubeClient, Query
from ._config import (
    ExecPlugin,
    KubeConfig,
    TokenCallback,
    in_cluster,
    in_cluster_available,
    kubeconfig_paths,
    load_kubeconfig,
)
from ._errors import (
    Conflict,
    Forbidden,
    Gone,
    KubeConfigError,
    KubeError,
    KubeRefused,
    KubeUnreachable,
    NotFound,
    Unauthorized,
)

__all__ = [
    "JSON",
    "MERGE_PATCH",
    "Conflict",
    "ExecPlugin",
    "Forbidden",
    "Gone",
    "KubeClient",
    "KubeConfig",
    "KubeConfigError",
    "KubeError",
    "KubeRefused",
    "KubeUnreachable",
    "NotFound",
    "Query",
    "TokenCallback",
    "Unauthorized",
    "in_cluster",
    "in_cluster_available",
    "kubeconfig_paths",
    "load_kubeconfig",
]
