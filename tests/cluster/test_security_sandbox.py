"""The sandbox pod on the real API server and the local node: Pod Security `restricted` admits
it (and refuses a weakened copy); the running harness holds no credential and no workspace, the
tools process (where the agent's commands run) holds nothing at all, and the custodian next to
them holds the keys."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral_api.kinds import Agent, Session
from corral_operator.builders.podbuilder import build_sandbox
from corral_operator.settings import OperatorSettings

from ._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(150)

MODEL_KEY = "sk-ant-o1-this-is-the-model-key-0123456789"
GIT_CREDENTIALS = "https://bot:ghp_o1gitcredentialsecret@git.example"


def _dry_run(op: OperatorHandle, manifest: dict[str, Any]) -> Any:
    return op.cp.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        op.namespace,
        "-f",
        "-",
        input=yaml.safe_dump(manifest),
        check=False,
    )


def test_pod_security_restricted_admits_the_sandbox_and_refuses_a_weakened_one(
    operator: OperatorHandle, git_repo: Path
) -> None:
    labels = json.loads(operator.cp.kubectl("get", "ns", operator.namespace, "-o", "json").stdout)
    assert labels["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    agent = Agent.model_validate(
        {
            "metadata": {"name": "coder", "namespace": operator.namespace, "uid": "a"},
            "spec": agent_doc()["spec"],
        }
    )
    session = Session.model_validate(
        {
            "metadata": {"name": "psa", "namespace": operator.namespace, "uid": "u"},
            "spec": session_doc("psa", git_repo)["spec"],
        }
    )
    pod = build_sandbox(agent, session, OperatorSettings(), "t" * 43, "c" * 43).pod
    assert [c["name"] for c in pod["spec"]["containers"]] == ["harness", "tools", "custodian"]
    pod["metadata"].pop("ownerReferences")  # a dry run has no Session to own it
    admitted = _dry_run(operator, pod)
    assert admitted.returncode == 0, admitted.stderr

    def escalate(p: dict[str, Any]) -> None:
        p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True

    def add_capability(p: dict[str, Any]) -> None:
        p["spec"]["containers"][1]["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}

    def tools_as_root(p: dict[str, Any]) -> None:
        p["spec"]["containers"][1]["securityContext"]["runAsUser"] = 0

    def run_as_root(p: dict[str, Any]) -> None:
        p["spec"]["initContainers"][0]["securityContext"]["runAsUser"] = 0

    def host_path(p: dict[str, Any]) -> None:
        p["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})

    weakenings: list[Callable[[dict[str, Any]], None]] = [
        escalate,
        add_capability,
        tools_as_root,
        run_as_root,
        host_path,
    ]
    for weaken in weakenings:
        weak = copy.deepcopy(pod)
        weaken(weak)
        refused = _dry_run(operator, weak)
        assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr


def _env_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").partition("=") for item in raw if item)
    return {k: v for k, _, v in pairs}


def _argv_of(pid: int) -> list[str]:
    return [
        a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    ]


def _pid_where(test: Callable[[int], bool]) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if test(int(entry.name)):
                    return int(entry.name)
            except OSError:
                continue
    return None


def _pid_with(marker: str) -> int | None:
    return _pid_where(
        lambda pid: marker.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    )


def _tools_pid(pod: str) -> int | None:
    """The tools container's process: the exec service, in the pod named by HOSTNAME."""

    def test(pid: int) -> bool:
        argv = _argv_of(pid)
        env = _env_of(pid)
        return env.get("HOSTNAME") == pod and "serve" in argv and "--socket" in argv

    return _pid_where(test)


def _files_under(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for root in paths:
        found += [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    return found


def test_the_running_roles_hold_only_what_is_theirs(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    ns = operator.namespace
    operator.cp.kubectl(
        "create", "secret", "generic", "model", "-n", ns, f"--from-literal=apiKey={MODEL_KEY}"
    )
    operator.cp.kubectl(
        "create",
        "secret",
        "generic",
        "git",
        "-n",
        ns,
        f"--from-literal=credentials={GIT_CREDENTIALS}",
    )
    name = f"{ns}-creds"
    scripted_model.load({"conversations": {name: [{"text": "slow", "delay": 15}]}})
    credentials = {
        "modelSecretRef": {"name": "model", "key": "apiKey"},
        "gitSecretRef": {"name": "git", "key": "credentials"},
    }
    operator.apply(agent_doc(credentials=credentials), session_doc(name, git_repo))
    wait_for("the turn in flight", lambda: operator.session_status(name).get("ledger"), 60)
    pod = operator.get("pod", f"corral-{name}")
    assert pod is not None
    ip = pod["status"]["podIP"]
    harness = wait_for("the harness", lambda: _pid_with(f"CORRAL_HARNESS_ADDR={ip}:8080"))
    custodian = wait_for("the custodian", lambda: _pid_with(f"CORRAL_CUSTODIAN_ADDR={ip}:8081"))
    tools = wait_for("the tools process", lambda: _tools_pid(f"corral-{name}"))
    h_env, c_env, t_env = _env_of(harness), _env_of(custodian), _env_of(tools)

    # The custodian has what it needs.
    assert Path(c_env["CORRAL_MODEL_KEY_FILE"]).read_text() == MODEL_KEY
    assert Path(c_env["CORRAL_GIT_CREDENTIALS_FILE"]).read_text() == GIT_CREDENTIALS
    sa_token = Path(c_env["CORRAL_KUBE_TOKEN_FILE"]).read_text().strip()
    assert sa_token.count(".") == 2  # a JWT from the TokenRequest API
    wire_token = Path(c_env["CORRAL_WIRE_TOKEN_FILE"]).read_text().strip()
    credential = Path(c_env["CORRAL_CUSTODIAN_CREDENTIAL_FILE"]).read_text().strip()
    secrets = (MODEL_KEY, "ghp_o1gitcredentialsecret", sa_token)

    # The harness has none of the keys, and no way into the workspace.
    for key in (
        "CORRAL_MODEL_KEY_FILE",
        "CORRAL_GIT_CREDENTIALS_FILE",
        "CORRAL_KUBE_TOKEN_FILE",
        "ANTHROPIC_API_KEY",
        "CORRAL_KUBE_CA_FILE",
        "KUBERNETES_SERVICE_HOST",
    ):
        assert key not in h_env, key
    h_values = "\n".join(h_env.values())
    for secret in secrets:
        assert secret not in h_values

    # The tools process (every command the agent runs) holds nothing: no token, no credential,
    # no Secret, no variable naming a control endpoint.
    # HOME, and git's trust of the checkout in its root-owned volume; nothing else.
    git_trust = {"GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_CONFIG_VALUE_0"}
    assert set(t_env) <= {"HOME", "HOSTNAME", "PATH", *git_trust}, sorted(t_env)
    t_values = "\n".join(t_env.values()) + "\n".join(_argv_of(tools))
    for secret in (*secrets, wire_token, credential):
        assert secret not in t_values
    argv = _argv_of(tools)
    workspace = Path(argv[argv.index("--root") + 1])
    assert (workspace / "README.md").is_file()  # the checkout is really there, for the hands

    # Every file under the harness's own mounts: its state, its scratch and the wire Secret.
    # None holds the key, the git secret or the service-account token, nor the checkout.
    mounts = [
        Path(h_env["CORRAL_STATE_DIR"]),
        Path(h_env["CORRAL_WIRE_TOKEN_FILE"]).parent,
        Path(h_env["HOME"]),
    ]
    assert not any(str(m).startswith(str(workspace)) for m in mounts)
    assert not any(str(workspace) in v for v in h_env.values())
    files = _files_under(mounts)
    assert all(f.name != "README.md" for f in files)
    for f in files:
        data = f.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f
