"""Where the sandbox pod keeps things: the paths and Secret keys its containers share, the
variable, mount and emptyDir primitives of its builders, and the volumes every pod has.

`corral_operator.builders.podbuilder` re-exports the paths and keys; import them from there.
"""

from __future__ import annotations

from typing import Any

from ..sandboxspec import WORKSPACE_MOUNT as WORKSPACE_MOUNT
from ..settings import OperatorSettings, VolumeSizes

STATE_MOUNT = "/var/lib/corral/state"
CUSTODIAN_STATE_MOUNT = "/var/lib/corral/custodian"
WIRE_DIR = "/var/run/corral/wire"
WIRE_TOKEN_DIR = WIRE_DIR  # the name earlier callers know
MODEL_KEY_DIR = "/var/run/corral/model"
# A cloud provider's credential (docs/providers.md), in the custodian alone, and the platform's
# provider entry the custodian reads (CORRAL_MODEL_PROVIDER, JSON).
AWS_CREDENTIALS_DIR = "/var/run/corral/aws"
AWS_WEB_IDENTITY_DIR = "/var/run/corral/aws-web-identity"
GCP_KEY_DIR = "/var/run/corral/gcp"
PROVIDER_ENV = "CORRAL_MODEL_PROVIDER"
GIT_CREDENTIALS_DIR = "/var/run/corral/git"
HOOK_SECRET_DIR = "/var/run/corral/hooks"  # credentials.hookSecretRef: http hooks' headers
MEMORY_DIR = "/var/run/corral/memory"  # the memory store's DSN, for the custodian alone
MEMORY_DSN_KEY = "memory-dsn"
# Behind the egress gateway, the custodian's forwarder of the memory database listens here:
# under its own state volume, which no other container mounts (_pgforward.py).
MEMORY_SOCKET_DIR = f"{CUSTODIAN_STATE_MOUNT}/memory-socket"
KUBE_TOKEN_DIR = "/var/run/corral/kube"
# The custodian's proxy credential for the egress gateway: one key of the Session's Secret,
# mounted in the custodian alone; the checkout reads it from a variable (docs/egress.md).
EGRESS_DIR = "/var/run/corral/egress"
EGRESS_CREDENTIAL_KEY = "egress"
EGRESS_CREDENTIAL_ENV = "CORRAL_EGRESS_CREDENTIAL"
EXEC_BIN_DIR = "/opt/corral-exec"
EXEC_BINARY = f"{EXEC_BIN_DIR}/corral-exec"
EXEC_SOCKET_DIR = "/var/run/corral/exec"
EXEC_SOCKET = f"{EXEC_SOCKET_DIR}/exec.sock"
WIRE_TOKEN_KEY = "token"
CUSTODIAN_CREDENTIAL_KEY = "custodian"
POD_IP_ENV = "CORRAL_POD_IP"
MODEL_CATALOG_DIR = "/etc/corral/catalog"
MODEL_CATALOG_KEY = "models.json"


def env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def mount(name: str, path: str, *, read_only: bool = False) -> dict[str, Any]:
    volume_mount: dict[str, Any] = {"name": name, "mountPath": path}
    if read_only:
        volume_mount["readOnly"] = True
    return volume_mount


def empty_dir(name: str, size: str, *, memory: bool = False) -> dict[str, Any]:
    source: dict[str, Any] = {"sizeLimit": size}
    if memory:
        source["medium"] = "Memory"
    return {"name": name, "emptyDir": source}


def scratch_and_wire_volumes(wire_secret: str, sizes: VolumeSizes) -> list[dict[str, Any]]:
    """Every container's own scratch space, the shared workspace and exec volumes, and the
    Session's Secret as the harness and the custodian see it (its two keys alone)."""
    return [
        empty_dir("workspace", sizes.workspace),
        empty_dir("state", sizes.state),
        empty_dir("harness-tmp", sizes.tmp),
        empty_dir("tools-tmp", sizes.tmp),
        # The checkout's own HOME and /tmp: never the agent's, which a re-run would trust.
        empty_dir("checkout-home", sizes.tmp),
        empty_dir("custodian-state", sizes.state),
        empty_dir("custodian-tmp", sizes.tmp),
        empty_dir("exec-bin", sizes.exec_bin),
        empty_dir("exec-socket", sizes.exec_socket, memory=True),
        {
            "name": "wire",
            "secret": {
                "secretName": wire_secret,
                "defaultMode": 0o440,
                "items": [
                    {"key": WIRE_TOKEN_KEY, "path": WIRE_TOKEN_KEY},
                    {"key": CUSTODIAN_CREDENTIAL_KEY, "path": CUSTODIAN_CREDENTIAL_KEY},
                ],
            },
        },
    ]


def kube_token_volume(settings: OperatorSettings) -> dict[str, Any]:
    """The custodian's projected service-account token, and the API server's CA when set."""
    sources: list[dict[str, Any]] = [
        {
            "serviceAccountToken": {
                "audience": settings.token_audience,
                "expirationSeconds": settings.token_expiry_seconds,
                "path": "token",
            }
        }
    ]
    if settings.kube_ca_configmap:
        sources.append(
            {
                "configMap": {
                    "name": settings.kube_ca_configmap,
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            }
        )
    return {"name": "kube-token", "projected": {"defaultMode": 0o440, "sources": sources}}
