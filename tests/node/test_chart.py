"""The chart's defaults: an install without the one required value fails naming it, and every
namespace where Sessions run gets what a sandbox pod needs (its ServiceAccount, Role and
RoleBinding). Rendered with `helm template` (no node needed); test_corral_on_node.py installs
the chart for real with `helm install`."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml

from corral_dev import controlplane
from corral_dev._realnode_stack import CHART

pytestmark = pytest.mark.timeout(120)


def helm_template(*values: str) -> subprocess.CompletedProcess[str]:
    args = [str(controlplane.binaries() / "helm"), "template", "corral", str(CHART)]
    args += ["--namespace", "corral-system", "--kube-version", "1.34.4"]
    for value in values:
        args += ["--set-json", value]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def rendered(*values: str) -> list[dict[str, Any]]:
    done = helm_template(*values)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def find(
    docs: list[dict[str, Any]], kind: str, namespace: str | None = None
) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if d["kind"] == kind and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]


def operator_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's Deployment (the egress gateway has its own)."""
    (deployment,) = [
        d for d in find(docs, "Deployment") if d["metadata"]["name"] == "corral-operator"
    ]
    return deployment


def operator_args(docs: list[dict[str, Any]]) -> list[str]:
    return list(operator_deployment(docs)["spec"]["template"]["spec"]["containers"][0]["args"])


def test_an_install_with_the_defaults_fails_naming_the_required_value() -> None:
    done = helm_template()
    assert done.returncode != 0
    assert "missing property 'watchNamespaces'" in done.stderr, done.stderr
    empty = helm_template("watchNamespaces=[]")
    assert empty.returncode != 0
    assert "/watchNamespaces" in empty.stderr and "minItems" in empty.stderr, empty.stderr


def test_each_watched_namespace_gets_the_sandbox_identity() -> None:
    docs = rendered(f"watchNamespaces={json.dumps(['team-a', 'team-b'])}")
    args = operator_args(docs)
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args
    # The one cluster-wide binding is the console's: TokenReview and SubjectAccessReview are
    # cluster-scoped, and the role grants nothing but creating them.
    (cluster_binding,) = find(docs, "ClusterRoleBinding")
    assert cluster_binding["roleRef"]["name"] == "corral-console"
    roles = find(docs, "ClusterRole")
    (console_role,) = [r for r in roles if r["metadata"]["name"] == "corral-console"]
    assert sorted((g, r, v) for rule in console_role["rules"] for g in rule["apiGroups"]
                  for r in rule["resources"] for v in rule["verbs"]) == [
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
    ]  # fmt: skip
    for ns in ("team-a", "team-b"):
        (account,) = find(docs, "ServiceAccount", ns)
        assert account["metadata"]["name"] == "corral-sandbox"
        assert account["automountServiceAccountToken"] is False
        roles = {r["metadata"]["name"] for r in find(docs, "Role", ns)}
        assert roles == {"corral-sandbox", "corral-egress-gateway"}
        bindings = {b["roleRef"]["name"]: b for b in find(docs, "RoleBinding", ns)}
        sandbox = bindings["corral-sandbox"]
        assert sandbox["subjects"] == [
            {"kind": "ServiceAccount", "name": "corral-sandbox", "namespace": ns}
        ]
        assert bindings["corral-operator"]["subjects"][0]["namespace"] == "corral-system"


def test_watching_every_namespace_takes_the_sandbox_namespaces_from_the_values() -> None:
    docs = rendered("watchNamespaces=[]", 'sandboxNamespaces=["agents"]')
    assert "--all-namespaces" in operator_args(docs)
    assert find(docs, "ClusterRoleBinding")
    accounts = {
        (a["metadata"]["namespace"], a["metadata"]["name"]) for a in find(docs, "ServiceAccount")
    }
    assert accounts == {
        ("agents", "corral-sandbox"),
        ("corral-system", "corral-operator"),
        ("corral-system", "corral-egress-gateway"),
    }
