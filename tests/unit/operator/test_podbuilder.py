"""The sandbox manifests: every security property of DESIGN §3, asserted on the dicts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral_operator import naming
from corral_operator.podbuilder import (
    SandboxSpecError,
    build_network_policy,
    build_pod,
    build_sandbox,
    resolve_repo,
)
from corral_operator.settings import EgressTarget, OperatorSettings

from ._fixtures import agent, session

TOKEN = "w" * 43
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


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.fixture
def pod() -> dict[str, Any]:
    return build_pod(agent(**CREDENTIALED), session(), SETTINGS)


def test_harness_holds_no_token_secret_or_key(pod: dict[str, Any]) -> None:
    harness = _containers(pod)["harness"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    for source in _mounted_sources(pod, harness):
        assert "projected" not in source, "no service-account token in the harness"
        if "secret" in source:
            # The one secret it may mount is its own wire token.
            assert source["secret"]["secretName"] == naming.wire_secret_name("fix-bug")
    for var in harness["env"]:
        assert "valueFrom" not in var or "fieldRef" in var["valueFrom"], var
        assert "KEY" not in var["name"] and "CREDENTIAL" not in var["name"]
    assert "envFrom" not in harness


def test_custodian_holds_model_key_git_credentials_and_the_only_token(
    pod: dict[str, Any],
) -> None:
    custodian = _containers(pod)["custodian"]
    sources = _mounted_sources(pod, custodian)
    secrets = {s["secret"]["secretName"] for s in sources if "secret" in s}
    assert secrets == {"model-key", "git-creds"}
    projected = [s["projected"] for s in sources if "projected" in s]
    assert len(projected) == 1
    token = projected[0]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == SETTINGS.token_audience
    assert 600 <= token["expirationSeconds"] <= 3600
    env = _env(custodian)
    assert env["CORRAL_MODEL_KEY_FILE"]["value"].startswith("/var/run/corral/model/")
    assert env["CORRAL_GIT_CREDENTIALS_FILE"]["value"].startswith("/var/run/corral/git/")
    assert env["CORRAL_KUBE_TOKEN_FILE"]["value"] == "/var/run/corral/kube/token"
    assert env["CORRAL_SESSION_UID"]["value"] == "0d9c7d5e-1111-2222-3333-444455556666"
    assert env["CORRAL_SESSION_BRANCH"]["value"] == "corral/fix-bug"
    assert json.loads(env["CORRAL_AGENT_SPEC_JSON"]["value"])["model"] == "claude-test"


def test_only_the_custodian_mounts_the_token_among_all_containers(pod: dict[str, Any]) -> None:
    holders = [
        name
        for name, c in _containers(pod).items()
        if any("projected" in s for s in _mounted_sources(pod, c))
    ]
    assert holders == ["custodian"]


def test_checkout_gets_git_credentials_but_not_the_model_key(pod: dict[str, Any]) -> None:
    init = _containers(pod)["checkout"]
    secrets = {s["secret"]["secretName"] for s in _mounted_sources(pod, init) if "secret" in s}
    assert secrets == {"git-creds"}
    assert init["args"][-1] == "/var/run/corral/git/credentials"


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
    assert env["CORRAL_GRANTED_ROOT"]["value"] == "/workspace"
    assert env["CORRAL_READ_ONLY"]["value"] == "false"
    # A variable is only expanded when it is defined earlier in the list.
    names = [e["name"] for e in harness["env"]]
    assert names.index("CORRAL_POD_IP") < names.index("CORRAL_HARNESS_ADDR")
    mounts = {m["mountPath"]: m["name"] for m in harness["volumeMounts"]}
    assert mounts["/workspace"] == "workspace" and mounts["/tmp"] == "tmp"


def test_state_and_scratch_are_empty_dirs_and_never_shared_with_the_custodian(
    pod: dict[str, Any],
) -> None:
    vols = _volumes(pod)
    for name in ("workspace", "state", "tmp", "custodian-state", "custodian-tmp"):
        assert vols[name] == {"name": name, "emptyDir": {}}
    harness = {m["name"] for m in _containers(pod)["harness"]["volumeMounts"]}
    custodian = {m["name"] for m in _containers(pod)["custodian"]["volumeMounts"]}
    # The workspace is the one volume both see (the custodian pushes from it).
    assert harness & custodian == {"workspace"}


def test_read_only_session_is_passed_to_the_harness() -> None:
    pod = build_pod(agent(), session(readOnly=True), SETTINGS)
    assert _env(_containers(pod)["harness"])["CORRAL_READ_ONLY"]["value"] == "true"


def test_owner_labels_runtime_class_and_resources() -> None:
    ag = agent(
        sandbox={
            "runtimeClassName": "gvisor",
            "resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}},
            "image": "corral/custom:1",
        }
    )
    child = session(name="child-1", parentRef={"name": "parent", "uid": "p-uid"})
    pod = build_pod(ag, child, SETTINGS)
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    harness = _containers(pod)["harness"]
    assert harness["resources"] == {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}
    assert {c["image"] for c in _containers(pod).values()} == {"corral/custom:1"}
    labels = pod["metadata"]["labels"]
    assert labels["corral.dev/session"] == "child-1"
    assert labels["corral.dev/agent"] == "coder"
    assert labels["corral.dev/parent"] == "parent"
    (owner,) = pod["metadata"]["ownerReferences"]
    assert owner["kind"] == "Session" and owner["uid"] == "0d9c7d5e-1111-2222-3333-444455556666"
    assert owner["controller"] is True and owner["apiVersion"] == "corral.dev/v1alpha1"


def test_no_runtime_class_by_default_and_default_image(pod: dict[str, Any]) -> None:
    assert "runtimeClassName" not in pod["spec"]
    assert {c["image"] for c in _containers(pod).values()} == {"corral/sandbox:test"}


def test_without_credentials_no_secret_volume_but_the_wire_token() -> None:
    pod = build_pod(agent(), session(), SETTINGS)
    secrets = [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert [s["name"] for s in secrets] == ["wire-token"]
    assert "CORRAL_MODEL_KEY_FILE" not in _env(_containers(pod)["custodian"])


def test_wire_secret_is_owned_and_holds_the_token() -> None:
    manifests = build_sandbox(agent(), session(), SETTINGS, TOKEN)
    secret = manifests.secret
    assert secret["stringData"] == {"token": TOKEN}
    assert secret["metadata"]["ownerReferences"][0]["name"] == "fix-bug"
    assert [m["kind"] for m in manifests.all()] == ["Secret", "NetworkPolicy", "Pod"]
    with pytest.raises(SandboxSpecError, match="32 characters"):
        build_sandbox(agent(), session(), SETTINGS, "short")


def test_network_policy_admits_only_the_operator_and_allowed_egress() -> None:
    ag = agent(sandbox={"egress": [{"cidr": "140.82.112.0/20", "ports": [443]}]})
    policy = build_network_policy(ag, session(), SETTINGS)["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["podSelector"]["matchLabels"]["corral.dev/session"] == "fix-bug"
    (ingress,) = policy["ingress"]
    assert ingress["ports"] == [{"protocol": "TCP", "port": 8080}]
    (peer,) = ingress["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "corral-system"
    }
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "corral-operator"}
    cidrs = [r["to"][0].get("ipBlock", {}).get("cidr") for r in policy["egress"]]
    assert cidrs == [None, "10.96.0.1/32", "140.82.112.0/20"]  # DNS, platform, agent
    assert policy["egress"][0]["ports"][0] == {"protocol": "UDP", "port": 53}


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
        ({"repo": "https://x/r.git", "grantedRoot": "/"}, "would cover the sandbox"),
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
