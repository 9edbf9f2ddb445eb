"""The sandbox manifests: every security property of the sandbox pod
(docs/security.md), asserted on the dicts.

Three roles, three containers, three uids (ADR 0060): the harness (brain), the tools (hands)
and the custodian (keys), each checked for what it holds and, above all, what it does not.
"""

from __future__ import annotations

import json
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from corral_api.kinds import Budget
from corral_operator import naming
from corral_operator.builders.podbuilder import (
    SandboxSpecError,
    build_network_policy,
    build_pod,
    build_sandbox,
    build_wire_secret,
    quantity,
    resolve_repo,
)
from corral_operator.settings import EgressTarget, OperatorSettings
from tests._objects import agent, session

TOKEN = "w" * 43
CREDENTIAL = "c" * 43
SESSION_UID = "0d9c7d5e-1111-2222-3333-444455556666"
SETTINGS = OperatorSettings(
    image="corral/sandbox:test",
    operator_namespace="corral-system",
    platform_egress=(EgressTarget("10.96.0.1/32", (443,)),),
)
CREDENTIALED: dict[str, Any] = {
    "credentials": {
        "modelSecretRef": {"name": "model-key", "key": "apiKey"},
        "gitSecretRef": {"name": "git-creds", "key": "credentials"},
    }
}


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = pod["spec"]
    return {c["name"]: c for c in [*spec["initContainers"], *spec["containers"]]}


def _volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def _mounted_sources(pod: dict[str, Any], container: dict[str, Any]) -> list[dict[str, Any]]:
    vols = _volumes(pod)
    return [vols[m["name"]] for m in container.get("volumeMounts", [])]


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _value(container: dict[str, Any], name: str) -> str:
    return str(_env(container)[name]["value"])


@pytest.fixture
def pod() -> dict[str, Any]:
    return build_pod(agent(**CREDENTIALED), session(), SETTINGS)


# --------------------------------------------------------------------------- the anatomy


def test_three_containers_two_init_containers_in_order(pod: dict[str, Any]) -> None:
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["install-exec", "checkout"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["harness", "tools", "custodian"]


def test_three_uids_and_one_shared_group(pod: dict[str, Any]) -> None:
    uids = {name: c["securityContext"]["runAsUser"] for name, c in _containers(pod).items()}
    assert uids["harness"] == 10001
    assert uids["tools"] == 10002
    assert uids["custodian"] == 10003
    assert uids["checkout"] == 10002  # the agent owns the files it works on
    for name, c in _containers(pod).items():
        assert c["securityContext"]["runAsGroup"] == c["securityContext"]["runAsUser"], name
    assert pod["spec"]["securityContext"]["fsGroup"] == 10000
    assert "runAsUser" not in pod["spec"]["securityContext"]  # each container names its own


def test_uids_come_from_the_settings() -> None:
    settings = OperatorSettings(harness_uid=2001, tools_uid=2002, custodian_uid=2003, fs_group=2000)
    pod = build_pod(agent(), session(), settings)
    uids = {name: c["securityContext"]["runAsUser"] for name, c in _containers(pod).items()}
    assert uids == {
        "install-exec": 2001,
        "checkout": 2002,
        "harness": 2001,
        "tools": 2002,
        "custodian": 2003,
    }
    assert pod["spec"]["securityContext"]["fsGroup"] == 2000


def test_install_exec_copies_the_exec_service_from_corrals_image() -> None:
    pod = build_pod(agent(sandbox={"image": "toolchain/go:1.26"}), session(), SETTINGS)
    init = _containers(pod)["install-exec"]
    assert init["image"] == "corral/sandbox:test"
    assert init["command"] == ["corral-exec", "install", "/opt/corral-exec"]
    assert _mounts(init) == {
        "/opt/corral-exec": {"name": "exec-bin", "mountPath": "/opt/corral-exec"}
    }
    assert "env" not in init


# ------------------------------------------------------------------------------ the hands


def test_tools_container_runs_the_exec_service_on_the_granted_root(pod: dict[str, Any]) -> None:
    tools = _containers(pod)["tools"]
    assert tools["command"] == [
        "/opt/corral-exec/corral-exec",
        "serve",
        "--socket",
        "/var/run/corral/exec/exec.sock",
        "--root",
        "/workspace",
    ]
    assert tools["workingDir"] == "/workspace"
    mounts = _mounts(tools)
    assert set(mounts) == {"/workspace", "/opt/corral-exec", "/var/run/corral/exec", "/tmp"}
    assert mounts["/workspace"]["name"] == "workspace"
    assert mounts["/workspace"].get("readOnly") is not True
    assert mounts["/opt/corral-exec"] == {
        "name": "exec-bin",
        "mountPath": "/opt/corral-exec",
        "readOnly": True,
    }
    assert mounts["/var/run/corral/exec"]["name"] == "exec-socket"
    assert mounts["/tmp"]["name"] == "tools-tmp"  # its own /tmp, shared with no other role


def test_tools_container_holds_no_token_secret_or_control_variable(pod: dict[str, Any]) -> None:
    tools = _containers(pod)["tools"]
    assert tools["env"] == [
        {"name": "HOME", "value": "/tmp"},
        # git may use the checkout that the tools uid owns in a root-owned volume
        {"name": "GIT_CONFIG_COUNT", "value": "1"},
        {"name": "GIT_CONFIG_KEY_0", "value": "safe.directory"},
        {"name": "GIT_CONFIG_VALUE_0", "value": "*"},
    ]
    assert "envFrom" not in tools
    for source in _mounted_sources(pod, tools):
        assert "secret" not in source and "projected" not in source and "configMap" not in source
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["enableServiceLinks"] is False  # no *_SERVICE_HOST variables either
    assert "ports" not in tools


def test_granted_root_below_the_workspace_keeps_the_mount_at_workspace() -> None:
    ws = {"repo": "https://x/r.git", "grantedRoot": "/workspace/services/api"}
    pod = build_pod(agent(), session(workspace=ws), SETTINGS)
    c = _containers(pod)
    assert c["tools"]["command"][-1] == "/workspace/services/api"
    assert c["tools"]["workingDir"] == "/workspace/services/api"
    assert _mounts(c["tools"])["/workspace"]["name"] == "workspace"
    assert _mounts(c["checkout"])["/workspace"]["name"] == "workspace"
    assert "/workspace" not in _mounts(c["custodian"])
    assert _value(c["harness"], "CORRAL_GRANTED_ROOT") == "/workspace/services/api"


@pytest.mark.parametrize(
    "root",
    [
        "/opt/corral/bin",
        "/",
        "/tmp",
        "/var/run/corral",
        "/workspacex",
        "/workspace/../etc",
        "/workspace/a/..",
        "/workspace//a",
        "/workspace/./a",
        "workspace",
    ],
)
def test_granted_root_outside_the_workspace_is_refused_naming_the_field(root: str) -> None:
    ws = {"repo": "https://x/r.git", "grantedRoot": root}
    with pytest.raises(SandboxSpecError, match=r"spec\.workspace\.grantedRoot"):
        build_pod(agent(), session(workspace=ws), SETTINGS)


def test_sandbox_image_sets_only_the_tools_container() -> None:
    pod = build_pod(agent(sandbox={"image": "corral/custom:1"}), session(), SETTINGS)
    images = {name: c["image"] for name, c in _containers(pod).items()}
    assert images.pop("tools") == "corral/custom:1"
    assert set(images.values()) == {"corral/sandbox:test"}


def test_no_runtime_class_by_default_and_default_image(pod: dict[str, Any]) -> None:
    assert "runtimeClassName" not in pod["spec"]
    assert {c["image"] for c in _containers(pod).values()} == {"corral/sandbox:test"}


# ------------------------------------------------------------------------------ the brain


def test_harness_has_no_workspace_mount(pod: dict[str, Any]) -> None:
    harness = _containers(pod)["harness"]
    assert all(m["name"] != "workspace" for m in harness["volumeMounts"])
    assert not any(m["mountPath"].startswith("/workspace") for m in harness["volumeMounts"])
    assert harness["workingDir"] == "/tmp"


def test_harness_holds_only_the_wire_secret(pod: dict[str, Any]) -> None:
    harness = _containers(pod)["harness"]
    mounts = _mounts(harness)
    assert set(mounts) == {
        "/var/lib/corral/state",
        "/tmp",
        "/var/run/corral/wire",
        "/var/run/corral/exec",
    }
    assert mounts["/tmp"]["name"] == "harness-tmp"
    assert mounts["/var/run/corral/wire"] == {
        "name": "wire",
        "mountPath": "/var/run/corral/wire",
        "readOnly": True,
    }
    for source in _mounted_sources(pod, harness):
        assert "projected" not in source, "no service-account token in the harness"
        if "secret" in source:
            assert source["secret"]["secretName"] == naming.wire_secret_name("fix-bug")
    for var in harness["env"]:
        assert "valueFrom" not in var or "fieldRef" in var["valueFrom"], var
        assert "KEY" not in var["name"], var
    assert "envFrom" not in harness


def test_harness_wire_contract(pod: dict[str, Any]) -> None:
    harness = _containers(pod)["harness"]
    env = _env(harness)
    assert harness["command"] == ["corral-harness"]
    assert harness["ports"][0]["containerPort"] == 8080
    assert harness["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8080}
    assert env["CORRAL_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["CORRAL_HARNESS_ADDR"]["value"] == "$(CORRAL_POD_IP):8080"
    assert env["ANTHROPIC_BASE_URL"]["value"] == env["CORRAL_CUSTODIAN_URL"]["value"]
    assert env["CORRAL_CUSTODIAN_URL"]["value"] == "http://$(CORRAL_POD_IP):8081"
    assert env["CORRAL_WIRE_TOKEN_FILE"]["value"] == "/var/run/corral/wire/token"
    assert env["CORRAL_CUSTODIAN_CREDENTIAL_FILE"]["value"] == "/var/run/corral/wire/custodian"
    assert env["CORRAL_EXEC_SOCKET"]["value"] == "/var/run/corral/exec/exec.sock"
    assert env["CORRAL_GRANTED_ROOT"]["value"] == "/workspace"
    assert env["CORRAL_READ_ONLY"]["value"] == "false"
    # A variable is only expanded when it is defined earlier in the list.
    names = [e["name"] for e in harness["env"]]
    assert names.index("CORRAL_POD_IP") < names.index("CORRAL_HARNESS_ADDR")


def test_read_only_session_is_passed_to_the_harness_and_the_custodian() -> None:
    pod = build_pod(agent(), session(readOnly=True), SETTINGS)
    assert _value(_containers(pod)["harness"], "CORRAL_READ_ONLY") == "true"
    assert _value(_containers(pod)["custodian"], "CORRAL_READ_ONLY") == "true"


# -------------------------------------------------------------------------------- the keys


def test_custodian_holds_model_key_git_credentials_and_the_only_token(
    pod: dict[str, Any],
) -> None:
    custodian = _containers(pod)["custodian"]
    sources = _mounted_sources(pod, custodian)
    secrets = {s["secret"]["secretName"] for s in sources if "secret" in s}
    assert secrets == {"model-key", "git-creds", naming.wire_secret_name("fix-bug")}
    projected = [s["projected"] for s in sources if "projected" in s]
    assert len(projected) == 1
    token = projected[0]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == SETTINGS.token_audience
    assert 600 <= token["expirationSeconds"] <= 3600
    env = _env(custodian)
    assert env["CORRAL_MODEL_KEY_FILE"]["value"].startswith("/var/run/corral/model/")
    assert env["CORRAL_GIT_CREDENTIALS_FILE"]["value"].startswith("/var/run/corral/git/")
    assert env["CORRAL_KUBE_TOKEN_FILE"]["value"] == "/var/run/corral/kube/token"
    assert env["CORRAL_SESSION_UID"]["value"] == SESSION_UID
    assert env["CORRAL_SESSION_BRANCH"]["value"] == "corral/fix-bug"
    assert json.loads(env["CORRAL_AGENT_SPEC_JSON"]["value"])["model"] == "claude-test"


def test_custodian_ports_files_and_identity(pod: dict[str, Any]) -> None:
    custodian = _containers(pod)["custodian"]
    ports = {p["name"]: p["containerPort"] for p in custodian["ports"]}
    assert ports == {"custodian": 8081, "custodian-op": 8082}
    env = _env(custodian)
    assert env["CORRAL_CUSTODIAN_ADDR"]["value"] == "$(CORRAL_POD_IP):8081"
    assert env["CORRAL_CUSTODIAN_OPERATOR_ADDR"]["value"] == "$(CORRAL_POD_IP):8082"
    assert env["CORRAL_CUSTODIAN_CREDENTIAL_FILE"]["value"] == "/var/run/corral/wire/custodian"
    assert env["CORRAL_WIRE_TOKEN_FILE"]["value"] == "/var/run/corral/wire/token"
    assert env["CORRAL_AGENT_NAME"]["value"] == "coder"
    assert env["CORRAL_GIT_REMOTE_URL"]["value"] == "https://git.example/repo.git"
    names = [e["name"] for e in custodian["env"]]
    assert names.index("CORRAL_POD_IP") < names.index("CORRAL_CUSTODIAN_OPERATOR_ADDR")
    mounts = _mounts(custodian)
    assert mounts["/var/run/corral/wire"]["readOnly"] is True
    assert "/var/run/corral/exec" not in mounts  # the keys never touch the exec socket


def test_custodian_gets_the_resolved_repository_as_its_remote() -> None:
    settings = OperatorSettings(local_repo_root="/srv/corral/repos")
    pod = build_pod(agent(), session(workspace={"repo": "demo/repo"}), settings)
    assert _value(_containers(pod)["custodian"], "CORRAL_GIT_REMOTE_URL") == (
        "/srv/corral/repos/demo/repo"
    )


def test_the_custodian_never_sees_the_workspace(pod: dict[str, Any]) -> None:
    # The agent's commits reach it as a bundle the tools side writes: a symlink the agent
    # plants in .git can never be resolved by the container holding the credentials.
    custodian = _containers(pod)["custodian"]
    assert all(m["name"] != "workspace" for m in custodian["volumeMounts"])
    assert not any(m["mountPath"].startswith("/workspace") for m in custodian["volumeMounts"])
    assert "CORRAL_WORKSPACE" not in _env(custodian)
    assert not any("/workspace" in str(e.get("value", "")) for e in custodian["env"])


def test_the_landing_check_is_not_frozen_into_the_pod() -> None:
    # The custodian reads the Session's and the Agent's landing check live through the API, so
    # an edit applies from the next land; nothing about it is baked into its environment.
    check = {"check": {"name": "unit-tests", "command": "make test"}}
    pod = build_pod(agent(landing=check), session(), SETTINGS)
    env = _env(_containers(pod)["custodian"])
    assert not [name for name in env if "LAND" in name]


def test_only_the_custodian_mounts_the_token_among_all_containers(pod: dict[str, Any]) -> None:
    holders = [
        name
        for name, c in _containers(pod).items()
        if any("projected" in s for s in _mounted_sources(pod, c))
    ]
    assert holders == ["custodian"]


def test_the_wire_secret_reaches_only_harness_and_custodian(pod: dict[str, Any]) -> None:
    holders = [
        name
        for name, c in _containers(pod).items()
        if any(m["name"] == "wire" for m in c["volumeMounts"])
    ]
    assert holders == ["harness", "custodian"]
    wire = _volumes(pod)["wire"]["secret"]
    assert wire["secretName"] == naming.wire_secret_name("fix-bug")
    assert [i["key"] for i in wire["items"]] == ["token", "custodian"]


def test_checkout_gets_git_credentials_but_not_the_model_key(pod: dict[str, Any]) -> None:
    init = _containers(pod)["checkout"]
    secrets = {s["secret"]["secretName"] for s in _mounted_sources(pod, init) if "secret" in s}
    assert secrets == {"git-creds"}
    assert init["args"][-1] == "/var/run/corral/git/credentials"


# ------------------------------------------------------------------------------ budgets


def test_the_custodian_gets_the_lower_of_session_and_agent_budget() -> None:
    ag = agent(limits={"budget": {"tokens": 100_000, "costUSD": 2.5}})
    pod = build_pod(ag, session(budget={"tokens": 50_000}), SETTINGS)
    env = _env(_containers(pod)["custodian"])
    assert env["CORRAL_BUDGET_TOKENS"]["value"] == "50000"
    assert float(env["CORRAL_BUDGET_COST"]["value"]) == 2.5


def test_an_explicit_effective_budget_wins_and_no_budget_sets_nothing() -> None:
    budget = Budget(tokens=1234, costUSD=0.125)
    pod = build_pod(agent(), session(), SETTINGS, budget=budget)
    env = _env(_containers(pod)["custodian"])
    assert env["CORRAL_BUDGET_TOKENS"]["value"] == "1234"
    assert float(env["CORRAL_BUDGET_COST"]["value"]) == 0.125
    plain = _env(_containers(build_pod(agent(), session(), SETTINGS))["custodian"])
    assert "CORRAL_BUDGET_TOKENS" not in plain and "CORRAL_BUDGET_COST" not in plain


def test_a_spent_budget_makes_no_pod() -> None:
    with pytest.raises(SandboxSpecError, match="spent"):
        build_pod(agent(), session(), SETTINGS, budget=Budget.model_construct(tokens=0))


# ------------------------------------------------------------------ resources and volumes


def test_every_container_has_requests_and_limits(pod: dict[str, Any]) -> None:
    for name, c in _containers(pod).items():
        res = c["resources"]
        for kind in ("requests", "limits"):
            assert set(res[kind]) == {"cpu", "memory"}, (name, kind)
            for key in ("cpu", "memory"):
                assert quantity(res["requests"][key], "x") <= quantity(res["limits"][key], "x")


def test_tools_resources_come_from_the_agent_over_the_defaults() -> None:
    ag = agent(
        sandbox={
            "runtimeClassName": "gvisor",
            "resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "3Gi"}},
        }
    )
    pod = build_pod(ag, session(), SETTINGS)
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    defaults = SETTINGS.resources
    tools = _containers(pod)["tools"]["resources"]
    assert tools == {
        "requests": {"cpu": "500m", "memory": defaults.tools.memory_request},
        "limits": {"cpu": defaults.tools.cpu_limit, "memory": "3Gi"},
    }
    # The Agent sizes the hands only; the brain and the keys keep theirs.
    assert _containers(pod)["harness"]["resources"] == defaults.harness.wire()
    assert _containers(pod)["custodian"]["resources"] == defaults.custodian.wire()


def test_a_default_limit_rises_to_the_agents_request_but_its_own_limit_is_kept() -> None:
    pod = build_pod(
        agent(sandbox={"resources": {"requests": {"memory": "8Gi"}}}), session(), SETTINGS
    )
    assert _containers(pod)["tools"]["resources"]["limits"]["memory"] == "8Gi"
    too_small = {"requests": {"cpu": "2"}, "limits": {"cpu": "500m"}}
    with pytest.raises(SandboxSpecError, match=r"spec\.sandbox\.resources\.requests\.cpu"):
        build_pod(agent(sandbox={"resources": too_small}), session(), SETTINGS)
    with pytest.raises(SandboxSpecError, match="not a Kubernetes quantity"):
        build_pod(agent(sandbox={"resources": {"limits": {"cpu": "lots"}}}), session(), SETTINGS)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", "0.5"),
        ("2", "2"),
        ("1Gi", str(2**30)),
        ("1G", "1e9"),
        ("1e3", "1000"),
        ("0.5Ki", "512"),
    ],
)
def test_quantities(text: str, value: str) -> None:
    assert quantity(text, "x") == Decimal(value)


def test_every_empty_dir_is_sized(pod: dict[str, Any]) -> None:
    sizes = {v["name"]: v["emptyDir"] for v in pod["spec"]["volumes"] if "emptyDir" in v}
    assert sizes == {
        "workspace": {"sizeLimit": "10Gi"},
        "state": {"sizeLimit": "1Gi"},
        "harness-tmp": {"sizeLimit": "1Gi"},
        "tools-tmp": {"sizeLimit": "1Gi"},
        "checkout-home": {"sizeLimit": "1Gi"},
        "custodian-state": {"sizeLimit": "1Gi"},
        "custodian-tmp": {"sizeLimit": "1Gi"},
        "exec-bin": {"sizeLimit": "128Mi"},
        "exec-socket": {"sizeLimit": "1Mi", "medium": "Memory"},
    }


def test_each_role_has_its_own_tmp_and_state(pod: dict[str, Any]) -> None:
    by_container = {
        name: {m["name"] for m in c["volumeMounts"]} for name, c in _containers(pod).items()
    }
    h, t, c = by_container["harness"], by_container["tools"], by_container["custodian"]
    assert h & t == {"exec-socket"}  # the brain and the hands share only the socket
    assert h & c == {"wire"}  # the brain and the keys share only the wire Secret
    assert t & c == set()  # the keys never see the hands' workspace: commits come as bundles


def test_every_container_is_restricted(pod: dict[str, Any]) -> None:
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for name, c in _containers(pod).items():
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True, name
        assert isinstance(sc["runAsUser"], int) and sc["runAsUser"] > 0, name
        assert sc["readOnlyRootFilesystem"] is True, name
        assert sc["allowPrivilegeEscalation"] is False, name
        assert sc["capabilities"] == {"drop": ["ALL"]}, name
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
    for v in pod["spec"]["volumes"]:
        assert "hostPath" not in v


def test_owner_and_labels() -> None:
    child = session(name="child-1", parentRef={"name": "parent", "uid": "p-uid"})
    pod = build_pod(agent(), child, SETTINGS)
    labels = pod["metadata"]["labels"]
    assert labels["corral.dev/session"] == "child-1"
    assert labels["corral.dev/agent"] == "coder"
    assert labels["corral.dev/parent"] == "parent"
    (owner,) = pod["metadata"]["ownerReferences"]
    assert owner["kind"] == "Session" and owner["uid"] == SESSION_UID
    assert owner["controller"] is True and owner["apiVersion"] == "corral.dev/v1alpha1"


def test_without_credentials_no_secret_volume_but_the_wire_secret() -> None:
    pod = build_pod(agent(), session(), SETTINGS)
    secrets = [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert [s["name"] for s in secrets] == ["wire"]
    assert "CORRAL_MODEL_KEY_FILE" not in _env(_containers(pod)["custodian"])


# ---------------------------------------------------------------- the Secret and the policy


def test_wire_secret_is_owned_and_holds_the_token_and_the_credential() -> None:
    manifests = build_sandbox(agent(), session(), SETTINGS, TOKEN, CREDENTIAL)
    secret = manifests.secret
    assert secret["stringData"] == {"token": TOKEN, "custodian": CREDENTIAL}
    assert secret["metadata"]["ownerReferences"][0]["name"] == "fix-bug"
    assert [m["kind"] for m in manifests.all()] == ["Secret", "NetworkPolicy", "Pod"]


@pytest.mark.parametrize(
    ("token", "credential", "problem"),
    [
        ("short", CREDENTIAL, "wire token must be at least 32"),
        (TOKEN, "short", "custodian credential must be at least 32"),
        (TOKEN, TOKEN, "must differ"),
    ],
)
def test_weak_secrets_are_refused(token: str, credential: str, problem: str) -> None:
    with pytest.raises(SandboxSpecError, match=problem):
        build_wire_secret(session(), token, credential)


def test_network_policy_admits_only_the_operator_and_allowed_egress() -> None:
    ag = agent(sandbox={"egress": [{"cidr": "140.82.112.0/20", "ports": [443]}]})
    policy = build_network_policy(ag, session(), SETTINGS)["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["podSelector"]["matchLabels"]["corral.dev/session"] == "fix-bug"
    (ingress,) = policy["ingress"]
    assert ingress["ports"] == [
        {"protocol": "TCP", "port": 8080},  # the wire
        {"protocol": "TCP", "port": 8082},  # the custodian's usage record
    ]
    (peer,) = ingress["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "corral-system"
    }
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "corral-operator"}
    cidrs = [r["to"][0].get("ipBlock", {}).get("cidr") for r in policy["egress"]]
    assert cidrs == [None, "10.96.0.1/32", "140.82.112.0/20"]  # DNS, platform, agent


def test_dns_goes_only_to_the_cluster_dns_pods() -> None:
    policy = build_network_policy(agent(), session(), SETTINGS)["spec"]
    dns = policy["egress"][0]
    (peer,) = dns["to"]
    assert peer == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    other = OperatorSettings(dns_namespace="dns", dns_pod_labels={"app": "coredns"})
    (peer,) = build_network_policy(agent(), session(), other)["spec"]["egress"][0]["to"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "dns"}
    assert peer["podSelector"]["matchLabels"] == {"app": "coredns"}


def test_network_policy_without_allowlist_has_no_open_egress() -> None:
    settings = OperatorSettings(allow_dns=False)
    policy = build_network_policy(agent(), session(), settings)["spec"]
    assert policy["egress"] == []
    assert "Egress" in policy["policyTypes"]  # an empty list with the type set denies all


@pytest.mark.parametrize(
    ("workspace", "reason"),
    [
        ({"repo": "https://x/r.git", "ref": "--upload-pack=evil"}, "must not start with '-'"),
        ({"repo": "--upload-pack=evil", "ref": "main"}, "must not start with '-'"),
        ({"repo": "https://x/r.git", "ref": "main~1 x"}, "not a valid git ref"),
        ({"repo": "https://x/r.git", "grantedRoot": "/"}, "spec.workspace.grantedRoot"),
    ],
)
def test_bad_workspace_is_refused_with_a_reason(workspace: dict[str, Any], reason: str) -> None:
    with pytest.raises(SandboxSpecError, match=reason):
        build_pod(agent(), session(workspace=workspace), SETTINGS)


ROOT = "/srv/corral/repos"


def _cloned(repo: str, settings: OperatorSettings) -> str:
    """The repository the checkout init container is told to clone."""
    init = _containers(build_pod(agent(), session(workspace={"repo": repo}), settings))["checkout"]
    return str(init["args"][3])


@pytest.mark.parametrize(
    ("repo", "cloned"),
    [
        ("demo/repo", f"{ROOT}/demo/repo"),
        ("./demo/./repo/", f"{ROOT}/demo/repo"),
        ("demo/x/../repo", f"{ROOT}/demo/repo"),
        ("~/repo", f"{ROOT}/~/repo"),  # git does not expand ~ and neither do we
    ],
)
def test_relative_repo_resolves_under_the_local_repo_root(repo: str, cloned: str) -> None:
    settings = OperatorSettings(local_repo_root=ROOT)
    assert _cloned(repo, settings) == cloned
    assert resolve_repo(repo, ROOT + "/") == cloned  # a trailing slash on the root is the same


@pytest.mark.parametrize(
    "repo",
    [
        "https://git.example/repo.git",
        "ssh://git@git.example/org/repo.git",
        "file:///srv/elsewhere/repo",
        "git@github.com:org/repo.git",
        "host:repo",
        "/srv/elsewhere/repo",
        "/srv/corral/repos/../secret",  # absolute: taken as written, the root does not apply
    ],
)
def test_urls_and_absolute_paths_are_cloned_as_written(repo: str) -> None:
    assert _cloned(repo, OperatorSettings(local_repo_root=ROOT)) == repo
    assert _cloned(repo, SETTINGS) == repo


@pytest.mark.parametrize("repo", ["..", "../other", "demo/../../other", "./..//x", ".", "demo/.."])
def test_relative_repo_cannot_escape_the_local_repo_root(repo: str) -> None:
    with pytest.raises(SandboxSpecError, match="is not inside the local repo root"):
        build_pod(
            agent(), session(workspace={"repo": repo}), OperatorSettings(local_repo_root=ROOT)
        )


@pytest.mark.parametrize("root", ["git://127.0.0.1:9418", "git://127.0.0.1:9418/"])
def test_relative_repo_under_a_git_server_root_is_that_servers(root: str) -> None:
    """The dev cluster's root is its git daemon's base URL: the checkout clones from it and the
    custodian may push there (a path it would never push to)."""
    settings = OperatorSettings(local_repo_root=root)
    assert _cloned("demo/repo", settings) == "git://127.0.0.1:9418/demo/repo"
    assert _cloned("./demo/x/../repo/", settings) == "git://127.0.0.1:9418/demo/repo"
    for escaping in ("..", "../other", "demo/../../other", "."):
        with pytest.raises(SandboxSpecError, match="is not inside the local repo root"):
            resolve_repo(escaping, root)


def test_root_itself_is_no_prefix_match_for_a_sibling() -> None:
    """`/srv/corral/repos-evil` starts with the root's text but is not inside it."""
    with pytest.raises(SandboxSpecError, match="is not inside"):
        resolve_repo("../repos-evil/x", ROOT)


def test_relative_repo_without_a_local_root_is_refused() -> None:
    assert OperatorSettings().local_repo_root is None  # off by default
    with pytest.raises(SandboxSpecError, match="relative path, which a cluster cannot clone"):
        build_pod(agent(), session(workspace={"repo": "demo/repo"}), SETTINGS)


def test_a_relative_local_repo_root_is_refused() -> None:
    with pytest.raises(SandboxSpecError, match="not absolute"):
        resolve_repo("demo/repo", "repos")


def test_session_must_name_the_agent_given() -> None:
    with pytest.raises(SandboxSpecError, match="names Agent"):
        build_pod(agent("other"), session(), SETTINGS)


def test_long_session_names_make_valid_object_names() -> None:
    name = "a" * 200
    pod = build_pod(agent(), session(name=name), SETTINGS)
    assert len(pod["metadata"]["name"]) <= 63
    assert len(pod["metadata"]["labels"]["corral.dev/session"]) <= 63
    assert naming.pod_name(name) != naming.pod_name("a" * 199)


def _git(*args: str, cwd: Path) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return out.stdout.strip()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("ref", ["main", "feature", "HEAD", "v1", "SHA"])
def test_checkout_script_puts_the_ref_on_the_session_branch(tmp_path: Path, ref: str) -> None:
    """Run the init container's real command (sh + git) against a real repository."""
    origin = tmp_path / "origin"
    origin.mkdir()
    _git("init", "-q", "-b", "main", cwd=origin)
    _git(
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "one",
        cwd=origin,
    )
    first = _git("rev-parse", "HEAD", cwd=origin)
    _git("tag", "v1", cwd=origin)
    _git("checkout", "-q", "-b", "feature", cwd=origin)
    _git(
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "two",
        cwd=origin,
    )
    feature = _git("rev-parse", "HEAD", cwd=origin)
    _git("checkout", "-q", "main", cwd=origin)
    wanted = {"main": first, "feature": feature, "HEAD": first, "v1": first, "SHA": feature}
    the_ref = feature if ref == "SHA" else ref

    dest = tmp_path / "ws"
    dest.mkdir()
    ws = {"repo": str(origin), "ref": the_ref}
    init = _containers(build_pod(agent(), session(workspace=ws), SETTINGS))["checkout"]
    args = [a if a != "/workspace" else str(dest) for a in init["args"]]
    subprocess.run(
        [*init["command"], *args],
        check=True,
        capture_output=True,
        timeout=20,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert _git("rev-parse", "--abbrev-ref", "HEAD", cwd=dest) == "corral/fix-bug"
    assert _git("rev-parse", "HEAD", cwd=dest) == wanted[ref]


@pytest.mark.timeout(30)
def test_checkout_script_does_not_run_shell_from_the_ref(tmp_path: Path) -> None:
    """A ref is data: `$(...)` in it reaches git as text, and the clone simply fails."""
    marker = tmp_path / "pwned"
    ws = {"repo": str(tmp_path / "nowhere"), "ref": f"$(touch${{IFS}}{marker})"}
    init = _containers(build_pod(agent(), session(workspace=ws), SETTINGS))["checkout"]
    args = [a if a != "/workspace" else str(tmp_path / "ws") for a in init["args"]]
    done = subprocess.run(
        [*init["command"], *args],
        capture_output=True,
        timeout=20,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode != 0
    assert not marker.exists()


@pytest.mark.timeout(30)
def test_checkout_script_starts_over_when_its_init_container_is_retried(tmp_path: Path) -> None:
    """A restarted init container finds the failed attempt's files in the volume."""
    origin = tmp_path / "origin"
    origin.mkdir()
    _git("init", "-q", "-b", "main", cwd=origin)
    _git(
        "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "one",
        cwd=origin,
    )  # fmt: skip
    dest = tmp_path / "ws"
    (dest / ".git").mkdir(parents=True)
    (dest / "half-written").write_text("left over")
    init = _containers(build_pod(agent(), session(workspace={"repo": str(origin)}), SETTINGS))[
        "checkout"
    ]
    args = [a if a != "/workspace" else str(dest) for a in init["args"]]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for _ in range(2):
        subprocess.run([*init["command"], *args], check=True, capture_output=True, env=env)
    assert _git("rev-parse", "--abbrev-ref", "HEAD", cwd=dest) == "corral/fix-bug"
    assert not (dest / "half-written").exists()


def test_the_catalog_overlay_is_mounted_into_the_harness_and_the_custodian_only() -> None:
    settings = OperatorSettings(model_catalog_configmap="corral-model-catalog")
    built = build_pod(agent(), session(), settings)
    (volume,) = [v for v in built["spec"]["volumes"] if v["name"] == "model-catalog"]
    assert volume["configMap"]["name"] == "corral-model-catalog"
    containers = {c["name"]: c for c in built["spec"]["containers"]}
    for role in ("harness", "custodian"):
        env = {e["name"]: e.get("value") for e in containers[role]["env"]}
        assert env["CORRAL_MODEL_CATALOG"] == "/etc/corral/catalog/models.json"
        mounts = {m["name"]: m for m in containers[role]["volumeMounts"]}
        assert mounts["model-catalog"]["readOnly"] is True
    assert "model-catalog" not in json.dumps(containers["tools"])
    without = build_pod(agent(), session(), OperatorSettings())
    assert "model-catalog" not in json.dumps(without)
