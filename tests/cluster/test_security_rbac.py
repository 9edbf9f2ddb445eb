"""RBAC on the real API server: the chart's operator rules are enough and no more; the sandbox
identity may ask for work (Sessions, Approvals) but never decide, create Evidence (only the
operator does) or read secrets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral_dev.controlplane import ControlPlane
from tests._objects import approval, evidence

from ._operator_fixtures import (
    OPERATOR_NAMESPACE,
    OPERATOR_SA,
    SANDBOX_SA,
    apply_docs,
    ensure_namespace,
    identity_kubeconfig,
    render_chart,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def chart_rbac(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    ensure_namespace(control_plane, OPERATOR_NAMESPACE)
    docs = render_chart(control_plane, f"corral-{namespace}", namespace)
    apply_docs(control_plane, [d for d in docs if d["kind"] != "Deployment"])
    yield namespace


@pytest.fixture
def other_namespace(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    name = f"{namespace}-other"
    control_plane.create_namespace(name)
    yield name
    control_plane.release_namespace(name)


def _can(
    cp: ControlPlane, who: str, verb: str, resource: str, namespace: str | None, name: str = ""
) -> bool:
    # `pods/exec` would read as a pod named exec: subresources go in their own flag, and an
    # object's name (a rule's resourceNames) is `name`.
    kind, _, sub = resource.partition("/")
    args = ["auth", "can-i", verb, f"{kind}/{name}" if name else kind, f"--as={who}"]
    if sub:
        args.append(f"--subresource={sub}")
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    done = cp.kubectl(*args, check=False)
    return done.stdout.strip() == "yes"


OPERATOR = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}"


@pytest.mark.parametrize(
    ("verb", "resource"),
    [
        ("create", "pods"),
        ("delete", "pods"),
        ("patch", "pods"),  # adopting a warm-pool pod relabels it
        ("watch", "pods"),
        ("get", "pods/log"),
        ("create", "secrets"),
        ("get", "secrets"),
        ("create", "networkpolicies.networking.k8s.io"),
        ("get", "networkpolicies.networking.k8s.io"),  # an existing one must be its own
        ("create", "events"),
        ("watch", "sessions.corral.dev"),
        ("patch", "sessions.corral.dev/status"),
        ("delete", "sessions.corral.dev"),
        ("update", "sessions.corral.dev/finalizers"),
        ("patch", "agents.corral.dev/status"),
        ("patch", "evidences.corral.dev/status"),
        ("create", "evidences.corral.dev"),  # only the operator creates Evidence
        ("create", "sessions.corral.dev"),  # a Goal's waves (docs/goals.md)
        ("patch", "goals.corral.dev"),  # the Goal daemon's finalizer and annotations
        ("patch", "goals.corral.dev/status"),
        ("watch", "approvals.corral.dev"),
        ("watch", "freezes.corral.dev"),
        ("list", "freezes.corral.dev"),
        ("patch", "freezes.corral.dev/status"),
        # A sandbox's disruption budget while its turn runs (docs/operations.md, "Drains").
        ("create", "poddisruptionbudgets.policy"),
        ("get", "poddisruptionbudgets.policy"),
        ("delete", "poddisruptionbudgets.policy"),
    ],
)
def test_the_operator_may_do_what_its_code_does(
    control_plane: ControlPlane, chart_rbac: str, verb: str, resource: str
) -> None:
    assert _can(control_plane, OPERATOR, verb, resource, chart_rbac)


@pytest.mark.parametrize(
    ("verb", "resource"),
    [
        ("update", "approvals.corral.dev/status"),  # deciding is for humans
        ("patch", "approvals.corral.dev/status"),
        ("list", "secrets"),  # it reads its own wire token by name, never lists
        ("delete", "secrets"),
        ("update", "secrets"),
        ("create", "pods/exec"),
        ("update", "pods"),
        ("create", "serviceaccounts/token"),
        ("update", "sessions.corral.dev"),  # a Session's spec is the user's
        ("update", "goals.corral.dev"),  # a Goal's spec is the user's
        ("create", "approvals.corral.dev"),
        ("delete", "agents.corral.dev"),
        ("create", "freezes.corral.dev"),  # a freeze is a person's switch
        ("delete", "freezes.corral.dev"),
        ("patch", "freezes.corral.dev"),
        ("update", "networkpolicies.networking.k8s.io"),  # never adopt or overwrite
        ("delete", "networkpolicies.networking.k8s.io"),
        ("update", "poddisruptionbudgets.policy"),  # held or lifted, never changed
        ("create", "pods/eviction"),  # it never drains
        ("create", "deployments.apps"),
        ("create", "rolebindings.rbac.authorization.k8s.io"),
        ("list", "namespaces"),
        ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ],
)
def test_the_operator_may_do_nothing_more(
    control_plane: ControlPlane, chart_rbac: str, verb: str, resource: str
) -> None:
    assert not _can(control_plane, OPERATOR, verb, resource, chart_rbac)


def test_a_namespaced_operator_has_no_rights_outside_its_namespaces(
    control_plane: ControlPlane, chart_rbac: str, other_namespace: str
) -> None:
    for verb, resource in (
        ("create", "pods"),
        ("get", "secrets"),
        ("watch", "sessions.corral.dev"),
    ):
        assert _can(control_plane, OPERATOR, verb, resource, chart_rbac)
        assert not _can(control_plane, OPERATOR, verb, resource, other_namespace)
        assert not _can(control_plane, OPERATOR, verb, resource, None)


def test_the_operator_reads_its_gateway_service_and_lists_pods_where_it_runs(
    control_plane: ControlPlane, chart_rbac: str
) -> None:
    gateway = f"corral-{chart_rbac}-egress-gateway"
    assert _can(control_plane, OPERATOR, "get", "services", OPERATOR_NAMESPACE, gateway)
    assert _can(control_plane, OPERATOR, "list", "pods", OPERATOR_NAMESPACE)
    assert not _can(control_plane, OPERATOR, "get", "services", OPERATOR_NAMESPACE, "another")
    for verb in ("list", "update", "delete"):
        assert not _can(control_plane, OPERATOR, verb, "services", OPERATOR_NAMESPACE)


# -------------------------------------------------------------------- egress gateway identity


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        ("get", "pods", True),
        ("list", "pods", True),
        ("watch", "pods", True),  # each pod's egress binding (docs/egress.md)
        ("create", "pods", False),
        ("patch", "pods", False),
        ("delete", "pods", False),
        ("get", "pods/log", False),
        ("create", "pods/exec", False),
        ("get", "secrets", False),  # never a Session's credential
        ("list", "secrets", False),
        ("get", "sessions.corral.dev", False),
        ("patch", "sessions.corral.dev/status", False),  # the operator writes what it records
        ("list", "services", False),
        ("create", "events", False),
    ],
)
def test_the_gateway_identity_reads_pods_and_nothing_else(
    control_plane: ControlPlane, chart_rbac: str, verb: str, resource: str, allowed: bool
) -> None:
    gateway = f"system:serviceaccount:{OPERATOR_NAMESPACE}:corral-{chart_rbac}-egress-gateway"
    assert _can(control_plane, gateway, verb, resource, chart_rbac) is allowed


def test_the_gateway_identity_reads_no_pods_outside_the_watched_namespaces(
    control_plane: ControlPlane, chart_rbac: str, other_namespace: str
) -> None:
    gateway = f"system:serviceaccount:{OPERATOR_NAMESPACE}:corral-{chart_rbac}-egress-gateway"
    assert _can(control_plane, gateway, "watch", "pods", chart_rbac)
    assert not _can(control_plane, gateway, "watch", "pods", other_namespace)
    assert not _can(control_plane, gateway, "list", "pods", None)


# ------------------------------------------------------------------------ sandbox identity


def _sandbox(namespace: str) -> str:
    return f"system:serviceaccount:{namespace}:{SANDBOX_SA}"


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        # Exactly what the custodian's code calls.
        ("create", "sessions.corral.dev", True),  # children
        ("get", "sessions.corral.dev", True),  # its own, its children, its parent chain
        ("list", "sessions.corral.dev", True),
        ("create", "approvals.corral.dev", True),
        ("get", "approvals.corral.dev", True),
        ("list", "approvals.corral.dev", True),
        ("get", "evidences.corral.dev", True),  # read before land
        ("list", "evidences.corral.dev", True),
        ("get", "agents.corral.dev", True),  # its Agent, read live
        # Only the operator creates Evidence; the sandbox never writes a verdict's object.
        ("create", "evidences.corral.dev", False),
        ("update", "evidences.corral.dev", False),
        ("delete", "evidences.corral.dev", False),
        ("patch", "evidences.corral.dev/status", False),
        ("update", "approvals.corral.dev/status", False),
        ("patch", "approvals.corral.dev/status", False),
        ("update", "approvals.corral.dev", False),
        ("delete", "approvals.corral.dev", False),
        ("patch", "sessions.corral.dev/status", False),
        ("update", "sessions.corral.dev", False),
        ("delete", "sessions.corral.dev", False),
        ("watch", "sessions.corral.dev", False),  # nothing it calls watches
        ("watch", "approvals.corral.dev", False),
        ("list", "agents.corral.dev", False),
        ("create", "agents.corral.dev", False),
        ("update", "agents.corral.dev", False),
        ("get", "goals.corral.dev", False),
        # Freezes are read live (a held session refuses work) and never written by the agent.
        ("get", "freezes.corral.dev", True),
        ("list", "freezes.corral.dev", True),
        ("create", "freezes.corral.dev", False),
        ("update", "freezes.corral.dev", False),
        ("patch", "freezes.corral.dev", False),
        ("delete", "freezes.corral.dev", False),
        ("patch", "freezes.corral.dev/status", False),
        ("get", "secrets", False),
        ("list", "secrets", False),
        ("create", "pods", False),
        ("create", "pods/exec", False),
        ("create", "serviceaccounts/token", False),
    ],
)
def test_the_sandbox_identity_asks_but_never_decides(
    control_plane: ControlPlane, chart_rbac: str, verb: str, resource: str, allowed: bool
) -> None:
    assert _can(control_plane, _sandbox(chart_rbac), verb, resource, chart_rbac) is allowed


def _approval(name: str, session_uid: str) -> dict[str, Any]:
    """An Approval as the sandbox may ask for one (its digest a placeholder)."""
    return approval(
        name,
        "some-session",
        session_uid,
        arguments={},
        digest="sha256:" + "0" * 64,
        reason="land asks a human",
    )


def _as(cp: ControlPlane, kubeconfig: Path, *args: str, doc: dict[str, Any] | None = None) -> Any:
    return cp.kubectl(
        *args, input=yaml.safe_dump(doc) if doc else None, kubeconfig=kubeconfig, check=False
    )


def test_the_sandbox_identity_really_creates_but_cannot_decide_read_secrets_or_cross(
    control_plane: ControlPlane, chart_rbac: str, other_namespace: str
) -> None:
    """Real requests with the sandbox's identity, not just `can-i`."""
    ns = chart_rbac
    sandbox = identity_kubeconfig(control_plane, ns, SANDBOX_SA)
    control_plane.kubectl(
        "create", "secret", "generic", "model-key", "-n", ns, "--from-literal=apiKey=sk-very-secret"
    )

    created = _as(control_plane, sandbox, "create", "-n", ns, "-f", "-", doc=_approval("a1", "u1"))
    assert created.returncode == 0, created.stderr

    decision = json.dumps({"status": {"decision": "Approved", "decidedBy": "the-agent"}})
    decided = _as(
        control_plane,
        sandbox,
        "patch",
        "approval",
        "a1",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        decision,
    )
    assert decided.returncode != 0 and "forbidden" in decided.stderr.lower()
    stored = json.loads(
        control_plane.kubectl("get", "approval", "a1", "-n", ns, "-o", "json").stdout
    )
    assert (stored.get("status") or {}).get("decision") in (None, "Pending")

    secret = _as(control_plane, sandbox, "get", "secret", "model-key", "-n", ns)
    assert secret.returncode != 0 and "forbidden" in secret.stderr.lower()
    assert "sk-very-secret" not in secret.stdout

    elsewhere = _as(
        control_plane,
        sandbox,
        "create",
        "-n",
        other_namespace,
        "-f",
        "-",
        doc=_approval("a2", "u2"),
    )
    assert elsewhere.returncode != 0 and "forbidden" in elsewhere.stderr.lower()
    listing = _as(control_plane, sandbox, "get", "sessions", "-n", other_namespace)
    assert listing.returncode != 0 and "forbidden" in listing.stderr.lower()


def _evidence(name: str) -> dict[str, Any]:
    return evidence(
        name,
        repo="https://example.invalid/repo.git",
        revision="0123456789abcdef0123456789abcdef01234567",
        command="true",
    )


def test_the_sandbox_identity_cannot_create_evidence(
    control_plane: ControlPlane, chart_rbac: str
) -> None:
    """A real request with the sandbox's identity: a verdict's object is the operator's alone,
    so an agent cannot mint the Evidence its own landing is gated on."""
    ns = chart_rbac
    sandbox = identity_kubeconfig(control_plane, ns, SANDBOX_SA)
    created = _as(control_plane, sandbox, "create", "-n", ns, "-f", "-", doc=_evidence("forged"))
    assert created.returncode != 0 and "forbidden" in created.stderr.lower(), created.stderr
    assert control_plane.kubectl("get", "evidence", "forged", "-n", ns, check=False).returncode
    # Reading Evidence (what land does) is allowed.
    control_plane.kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump(_evidence("real")))
    read = _as(control_plane, sandbox, "get", "evidence", "real", "-n", ns, "-o", "name")
    assert read.returncode == 0, read.stderr


def test_the_sandbox_identity_cannot_freeze_or_unfreeze(
    control_plane: ControlPlane, chart_rbac: str
) -> None:
    """Real requests: the agent can neither lift a freeze on itself nor freeze others."""
    ns = chart_rbac
    sandbox = identity_kubeconfig(control_plane, ns, SANDBOX_SA)
    freeze = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Freeze",
        "metadata": {"name": "namespace"},
        "spec": {"scope": {"namespace": True}},
    }
    created = _as(control_plane, sandbox, "create", "-n", ns, "-f", "-", doc=freeze)
    assert created.returncode != 0 and "forbidden" in created.stderr.lower(), created.stderr
    control_plane.kubectl("create", "-n", ns, "-f", "-", input=yaml.safe_dump(freeze))
    for args in (
        ("delete", "freeze", "namespace", "-n", ns),
        ("patch", "freeze", "namespace", "-n", ns, "--type=merge", "-p",
         '{"spec": {"frozen": false}}'),
    ):  # fmt: skip
        refused = _as(control_plane, sandbox, *args)
        assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr
    still = control_plane.kubectl("get", "freeze", "namespace", "-n", ns, "-o", "json").stdout
    assert json.loads(still)["spec"]["frozen"] is True
    read = _as(control_plane, sandbox, "get", "freezes", "-n", ns, "-o", "name")
    assert read.returncode == 0 and "freeze.corral.dev/namespace" in read.stdout


def test_the_chart_renders_with_defaults_and_refuses_bad_values(
    control_plane: ControlPlane,
) -> None:
    docs = render_chart(control_plane, "corral", "team-a")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ServiceAccount",
            "ClusterRole",
            "RoleBinding",
            "Role",
            "RoleBinding",
            "Deployment",
            "ClusterRole",  # freezer (docs/freeze.md)
            "ConfigMap",  # the model catalog (docs/model-catalog.md)
            # Deciding Approvals and reading Evidence (docs/approvals.md, docs/ci.md).
            "ClusterRole",
            "ClusterRole",
            "ValidatingAdmissionPolicy",
            # The console: its own TokenReview/SubjectAccessReview role, a viewer role for
            # people, its Service (docs/console.md); the archive's claim and reader Service
            # (docs/history.md); the metrics Service (docs/observability.md).
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "Service",
            "PersistentVolumeClaim",
            "Service",
            "Service",
            "ValidatingAdmissionPolicyBinding",
            # The egress gateway (docs/egress.md): its identity, its pod-reading Role in the
            # watched namespace, its Deployment, Service, disruption budget and NetworkPolicy;
            # the operator's Role to read that Service and list its pods; the key that signs
            # each pod's binding, shared by the two.
            "Secret",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "Role",
            "RoleBinding",
            "NetworkPolicy",  # the operator's own (operator.networkPolicy)
            # `corral logs` through the API server's service proxy: get on the reader's Service
            # (bound only to archive.proxySubjects, none by default).
            "Role",
            # Leader election (ADR 0103): the one Lease the operator's replicas share.
            "Role",
            "RoleBinding",
        ]
    )
    deployment = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "corral-operator"
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    assert "--namespace=team-a" in container["args"]
    args = container["args"]
    for flag in ("--harness-uid=10001", "--tools-uid=10002", "--custodian-uid=10003"):
        assert flag in args
    assert "--fs-group=10000" in args
    assert "--egress-gateway-service=corral-system/corral-egress-gateway" in args
    assert not any(a.startswith(("--dns-", "--no-dns-egress")) for a in args)
    with pytest.raises(Exception, match="uids"):
        render_chart(control_plane, "corral", "team-a", **{"sandbox.uids.tools": 0})
