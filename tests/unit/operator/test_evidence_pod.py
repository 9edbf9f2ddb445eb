"""The Evidence check pod and its NetworkPolicy (pure manifests), and the planner's refusals:
no service-account token, limits everywhere, sized volumes, deny-by-default network."""

from __future__ import annotations

from typing import Any

import pytest

from corral_api.digest import check_definition_digest
from corral_api.kinds import Evidence
from corral_operator.builders.evidencepod import (
    CHECK_CONTAINER,
    EvidenceSettings,
    EvidenceSpecError,
    build_evidence_manifests,
    build_evidence_network_policy,
    build_evidence_pod,
)
from corral_operator.planning.evidence import plan_evidence
from corral_operator.settings import EgressTarget, OperatorSettings

SHA = "a" * 40
NOW = "2026-11-29T12:00:00Z"
GIT = EgressTarget("192.0.2.10/32", (443,))
SETTINGS = OperatorSettings(platform_egress=(GIT,))


def _body(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "repo": "https://git.example/r.git",
        "revision": SHA,
        "check": "unit",
        "command": "make test",
    }
    base.update(spec)
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Evidence",
        "metadata": {"name": "unit-x", "namespace": "a", "uid": "ev-uid", "generation": 1},
        "spec": base,
    }


def _evidence(**spec: Any) -> Evidence:
    return Evidence.model_validate(_body(**spec))


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]


# --------------------------------------------------------------------------------------- pod


def test_the_pod_has_no_service_account_token_and_no_secret() -> None:
    pod = build_evidence_pod(_evidence(), SETTINGS)
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert "serviceAccountName" not in spec
    for volume in spec["volumes"]:
        assert set(volume) == {"name", "emptyDir"}  # no secret, projected token or hostPath
    for c in _containers(pod):
        assert all("valueFrom" not in e for e in c["env"])
        assert all(m["name"] in ("workspace", "tmp") for m in c["volumeMounts"])


def test_every_container_has_requests_and_limits_and_every_emptydir_a_size() -> None:
    pod = build_evidence_pod(_evidence(), SETTINGS)
    for c in _containers(pod):
        for kind in ("requests", "limits"):
            assert set(c["resources"][kind]) == {"cpu", "memory"}, c["name"]
    for volume in pod["spec"]["volumes"]:
        assert volume["emptyDir"]["sizeLimit"]
    cfg = EvidenceSettings(workspace_size="5Gi", active_deadline_seconds=60)
    sized = build_evidence_pod(_evidence(), SETTINGS, cfg)
    assert {"name": "workspace", "emptyDir": {"sizeLimit": "5Gi"}} in sized["spec"]["volumes"]
    assert sized["spec"]["activeDeadlineSeconds"] == 60


def test_the_pod_is_restricted_runs_once_and_checks_out_the_revision() -> None:
    pod = build_evidence_pod(_evidence(image="ghcr.io/x/check:1"), SETTINGS)
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] > 0
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in _containers(pod):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True
        assert c["image"] == "ghcr.io/x/check:1"
    checkout = spec["initContainers"][0]
    assert "https://git.example/r.git" in checkout["args"] and SHA in checkout["args"]
    check = spec["containers"][0]
    assert check["name"] == CHECK_CONTAINER and check["command"] == ["sh", "-c", "make test"]
    # git trusts the workspace (a volume root owns it) and nothing else.
    env = {e["name"]: e["value"] for e in check["env"]}
    assert env["GIT_CONFIG_KEY_0"] == "safe.directory" and env["GIT_CONFIG_VALUE_0"] == "/workspace"
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Evidence", "unit-x", "ev-uid")


def test_a_relative_repo_is_refused_unless_a_local_root_is_set() -> None:
    with pytest.raises(EvidenceSpecError, match="relative"):
        build_evidence_manifests(_evidence(repo="demo/repo"), SETTINGS)
    local = OperatorSettings(local_repo_root="/srv/repos")
    pod = build_evidence_pod(_evidence(repo="demo/repo"), local)
    assert "/srv/repos/demo/repo" in pod["spec"]["initContainers"][0]["args"]
    with pytest.raises(EvidenceSpecError):
        build_evidence_pod(_evidence(repo="../etc"), local)
    with pytest.raises(EvidenceSpecError):
        build_evidence_pod(_evidence(repo="-uhttps://x"), SETTINGS)


def test_a_relative_repo_under_a_git_server_root_is_cloned_from_that_server() -> None:
    """`make dev-cluster` resolves the examples' `demo/repo` against its git daemon: the pod
    clones that URL, and the checkout is given the git egress a remote needs."""
    served = OperatorSettings(platform_egress=(GIT,), local_repo_root="git://192.0.2.10:9418/")
    ev = _evidence(repo="demo/repo")
    pod = build_evidence_pod(ev, served)
    assert "git://192.0.2.10:9418/demo/repo" in pod["spec"]["initContainers"][0]["args"]
    egress = build_evidence_network_policy(ev, served)["spec"]["egress"]
    assert [r["to"][0].get("ipBlock", {}).get("cidr") for r in egress] == [None, "192.0.2.10/32"]
    with pytest.raises(EvidenceSpecError):
        build_evidence_pod(_evidence(repo="../etc"), served)


# ------------------------------------------------------------------------------ NetworkPolicy


def _selects(policy: dict[str, Any], pod: dict[str, Any]) -> bool:
    wanted = policy["spec"]["podSelector"]["matchLabels"]
    labels = pod["metadata"]["labels"]
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def test_the_policy_selects_exactly_its_pod_and_is_owned_by_the_evidence() -> None:
    manifests = build_evidence_manifests(_evidence(), SETTINGS)
    policy, pod = manifests.network_policy, manifests.pod
    assert manifests.all() == [policy, pod]  # the policy is created first
    assert _selects(policy, pod)
    other = build_evidence_pod(
        Evidence.model_validate({**_body(), "metadata": {**_body()["metadata"], "name": "y"}}),
        SETTINGS,
    )
    assert not _selects(policy, other)
    assert policy["metadata"]["namespace"] == pod["metadata"]["namespace"]
    assert policy["metadata"]["ownerReferences"] == pod["metadata"]["ownerReferences"]


def test_no_ingress_and_egress_only_to_the_check_and_the_git_host() -> None:
    ev = _evidence(egress=[{"cidr": "10.1.0.0/16", "ports": [8443]}, {"cidr": "10.2.0.0/16"}])
    policy = build_evidence_network_policy(ev, SETTINGS)
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == []
    dns, *rest = spec["egress"]
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert dns["to"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
    }
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert rest == [
        {
            "to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        },
        {
            "to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}],
            "ports": [{"protocol": "TCP", "port": 8443}],
        },
        {"to": [{"ipBlock": {"cidr": "10.2.0.0/16"}}]},
    ]


def test_a_local_repo_and_no_check_egress_deny_everything() -> None:
    for repo in ("/srv/repos/r", "file:///srv/repos/r"):
        policy = build_evidence_network_policy(_evidence(repo=repo), SETTINGS)
        assert policy["spec"]["egress"] == [] and policy["spec"]["ingress"] == []
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]


def test_git_egress_can_be_narrower_than_the_platform_egress() -> None:
    cfg = EvidenceSettings(git_egress=(EgressTarget("198.51.100.7/32", (22, 443)),))
    policy = build_evidence_network_policy(_evidence(), SETTINGS, cfg)
    cidrs = [r["to"][0].get("ipBlock", {}).get("cidr") for r in policy["spec"]["egress"]]
    assert cidrs == [None, "198.51.100.7/32"]  # DNS, then only the git host
    other_dns = OperatorSettings(
        platform_egress=(GIT,), dns_namespace="dns", dns_pod_labels={"app": "coredns"}
    )
    (dns, _) = build_evidence_network_policy(_evidence(), other_dns)["spec"]["egress"]
    assert dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "dns"}},
            "podSelector": {"matchLabels": {"app": "coredns"}},
        }
    ]
    no_dns = OperatorSettings(platform_egress=(GIT,), allow_dns=False)
    only_git = build_evidence_network_policy(_evidence(), no_dns)["spec"]["egress"]
    assert [r["to"][0]["ipBlock"]["cidr"] for r in only_git] == ["192.0.2.10/32"]


# ------------------------------------------------------------------------------- the planner


def test_a_definition_digest_that_does_not_match_is_an_error_and_never_runs() -> None:
    body = _body(definitionDigest=check_definition_digest("true", None))
    plan = plan_evidence(body, None, NOW)
    assert not plan.create_pod
    assert plan.status["verdict"] == "Error" and "definitionDigest" in plan.status["logTail"]
    good = _body(definitionDigest=check_definition_digest("make test", None))
    assert plan_evidence(good, None, NOW).create_pod


def test_a_refused_pod_is_an_error() -> None:
    plan = plan_evidence(_body(), None, NOW, refusal="spec.repo 'x' is a relative path")
    assert not plan.create_pod and plan.status["verdict"] == "Error"
    assert plan.status["logTail"] == "spec.repo 'x' is a relative path"


def test_a_check_past_its_deadline_is_an_error() -> None:
    pod = {
        "metadata": {"name": "corral-ev-unit-x"},
        "status": {"phase": "Failed", "reason": "DeadlineExceeded", "message": "too long"},
    }
    plan = plan_evidence({**_body(), "status": {"verdict": "Pending"}}, pod, NOW, "last words")
    assert plan.finished and plan.status["verdict"] == "Error"
    assert "too long" in plan.status["logTail"] and "last words" in plan.status["logTail"]
