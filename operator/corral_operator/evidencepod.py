"""The Evidence check pod: a fresh checkout at the revision and the command, nothing else.

Never the agent's sandbox and never next to a credential: no service-account token, no
secret volume, the restricted security context, and it runs once (restartPolicy Never).
"""

from __future__ import annotations

from typing import Any

from corral_api.kinds import Evidence

from . import naming
from .podbuilder import CHECKOUT_SCRIPT, owner_reference, restricted_security_context
from .settings import OperatorSettings

CHECK_CONTAINER = "check"
_WORKSPACE = "/workspace"


def build_evidence_pod(evidence: Evidence, settings: OperatorSettings) -> dict[str, Any]:
    md = evidence.metadata
    name, namespace, uid = str(md["name"]), str(md["namespace"]), str(md["uid"])
    spec = evidence.spec
    image = spec.image or settings.image
    security = restricted_security_context(settings.run_as_user)
    mounts = [
        {"name": "workspace", "mountPath": _WORKSPACE},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    env = [{"name": "HOME", "value": "/tmp"}, {"name": "GIT_TERMINAL_PROMPT", "value": "0"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": naming.evidence_pod_name(name),
            "namespace": namespace,
            "labels": {
                naming.LABEL_EVIDENCE: naming.label_value(name),
                naming.LABEL_COMPONENT: "evidence",
                naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
            },
            "ownerReferences": [owner_reference("Evidence", name, uid)],
        },
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": settings.run_as_user,
                "runAsGroup": settings.run_as_user,
                "fsGroup": settings.run_as_user,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "initContainers": [
                {
                    "name": "checkout",
                    "image": image,
                    "command": ["sh"],
                    "args": [
                        "-c",
                        CHECKOUT_SCRIPT,
                        "checkout",
                        spec.repo,
                        spec.revision,
                        f"corral/evidence-{spec.check}",
                        _WORKSPACE,
                    ],
                    "env": env,
                    "volumeMounts": mounts,
                    "securityContext": dict(security),
                }
            ],
            "containers": [
                {
                    "name": CHECK_CONTAINER,
                    "image": image,
                    "command": ["sh", "-c", spec.command],
                    "workingDir": _WORKSPACE,
                    "env": env,
                    "volumeMounts": mounts,
                    "securityContext": dict(security),
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
            "volumes": [{"name": "workspace", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
        },
    }
