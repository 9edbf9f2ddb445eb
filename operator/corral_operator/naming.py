"""Names and labels of what the operator creates for a Session, in one place."""

from __future__ import annotations

import hashlib

from corral_common.branches import default_session_branch

LABEL_SESSION = "corral.dev/session"
LABEL_AGENT = "corral.dev/agent"
LABEL_PARENT = "corral.dev/parent"
LABEL_EVIDENCE = "corral.dev/evidence"
LABEL_GOAL = "corral.dev/goal"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "corral-operator"
# A warm pool's pods: the Agent one was started for (kept after adoption), their component
# until adopted, and the digest of what they were built from (docs/warm-pool.md).
LABEL_POOL = "corral.dev/pool"
COMPONENT_POOL = "pool"
ANNOTATION_DIGEST = "corral.dev/agent-digest"
# Written on a sandbox pod the operator drains itself, before it deletes it: why, so the
# Session's Resumed condition names the cause rather than a bare deletion.
ANNOTATION_DRAINED = "corral.dev/drained"
# The egress gateway serves the pods with this label, bound by this annotation (docs/egress.md).
LABEL_EGRESS = "corral.dev/egress"
EGRESS_VIA_GATEWAY = "gateway"
ANNOTATION_EGRESS_BINDING = "corral.dev/egress-binding"
# HMAC-SHA256 of the binding with the key the operator and the gateway share.
ANNOTATION_EGRESS_SIGNATURE = "corral.dev/egress-binding-signature"
# The Evidence check pod's container that runs the check (its termination says the verdict).
CHECK_CONTAINER = "check"

# Kubernetes object names are at most 253 characters, label values and pod hostnames 63: a
# Session name is a DNS subdomain, so derived names are shortened with a stable hash suffix.
_MAX_NAME = 63


def _bounded(prefix: str, name: str, suffix: str = "") -> str:
    full = f"{prefix}{name}{suffix}"
    if len(full) <= _MAX_NAME:
        return full
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    room = _MAX_NAME - len(prefix) - len(suffix) - 9
    return f"{prefix}{name[:room].rstrip('-.')}-{digest}{suffix}"


def pod_name(session: str) -> str:
    return _bounded("corral-", session)


def wire_secret_name(session: str) -> str:
    return _bounded("corral-", session, "-wire")


def network_policy_name(session: str) -> str:
    return _bounded("corral-", session)


def evidence_pod_name(evidence: str) -> str:
    return _bounded("corral-ev-", evidence)


def session_branch(session: str) -> str:
    """A Session's branch when spec.workspace.branch is unset (corral_common.branches)."""
    return default_session_branch(session)


def label_value(value: str) -> str:
    """A label value (at most 63 characters) that still identifies `value`."""
    return _bounded("", value)
