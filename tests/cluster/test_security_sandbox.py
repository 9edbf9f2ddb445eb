"""The sandbox pod on the real API server and the local node: Pod Security `restricted` admits
it (and refuses a weakened copy), and the running harness process holds no credential in its
environment or in any file it mounts, while the custodian next to it does."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral_api.kinds import Agent, Session
from corral_operator.podbuilder import build_sandbox
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
    pod = build_sandbox(agent, session, OperatorSettings(), "t" * 43).pod
    pod["metadata"].pop("ownerReferences")  # a dry run has no Session to own it
    admitted = _dry_run(operator, pod)
    assert admitted.returncode == 0, admitted.stderr

    def escalate(p: dict[str, Any]) -> None:
        p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True

    def add_capability(p: dict[str, Any]) -> None:
        p["spec"]["containers"][1]["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}

    def run_as_root(p: dict[str, Any]) -> None:
        p["spec"]["initContainers"][0]["securityContext"]["runAsUser"] = 0

    def host_path(p: dict[str, Any]) -> None:
        p["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})

    weakenings: list[Callable[[dict[str, Any]], None]] = [
        escalate,
        add_capability,
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


def _pid_with(marker: str) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes().split(b"\0"):
                    return int(entry.name)
            except OSError:
                continue
    return None


def _files_under(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for root in paths:
        found += [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    return found


def test_the_running_harness_holds_no_credential_in_env_or_files(
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
    h_env, c_env = _env_of(harness), _env_of(custodian)

    # The custodian has what it needs; the harness has none of it.
    assert Path(c_env["CORRAL_MODEL_KEY_FILE"]).read_text() == MODEL_KEY
    assert Path(c_env["CORRAL_GIT_CREDENTIALS_FILE"]).read_text() == GIT_CREDENTIALS
    sa_token = Path(c_env["CORRAL_KUBE_TOKEN_FILE"]).read_text().strip()
    assert sa_token.count(".") == 2  # a JWT from the TokenRequest API
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
    for secret in (MODEL_KEY, "ghp_o1gitcredentialsecret", sa_token):
        assert secret not in h_values

    # Every file under the harness's own mounts: the workspace, its state, its scratch and
    # the wire token. None holds the key, the git secret or the service-account token.
    mounts = [
        Path(h_env["CORRAL_GRANTED_ROOT"]),
        Path(h_env["CORRAL_STATE_DIR"]),
        Path(h_env["CORRAL_WIRE_TOKEN_FILE"]).parent,
        Path(h_env["HOME"]),
    ]
    files = _files_under(mounts)
    assert any(f.name == "README.md" for f in files)  # the checkout is really there
    for f in files:
        data = f.read_bytes()
        for secret in (MODEL_KEY, "ghp_o1gitcredentialsecret", sa_token):
            assert secret.encode() not in data, f
