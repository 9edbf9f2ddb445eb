"""Fixtures and helpers for the operator's cluster tests (this module holds no tests).

The operator runs as a real `corral-operator` subprocess under the chart's RBAC: the chart is
rendered with `helm template`, its RBAC is applied to the real API server, and the operator
authenticates as `system:serviceaccount:<ns>:corral-operator` with a client certificate the
control plane's CA signs, so every call it makes is checked against exactly the chart's rules.
The sandbox pods run on the local node; the model is the project's scripted server.
"""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from corral_dev import controlplane, stack
from corral_dev.controlplane import ControlPlane
from corral_dev.stack import (
    OPERATOR_NAMESPACE,
    OPERATOR_SA,
    SANDBOX_SA,
    apply_docs,
    ensure_namespace,
    identity_kubeconfig,
    render_chart,
)

from .._scripted import load_script, model_requests
from ._node_fixtures import LocalNodeHandle

__all__ = [
    "OPERATOR_NAMESPACE",
    "OPERATOR_SA",
    "SANDBOX_SA",
    "OperatorExtras",
    "OperatorHandle",
    "ScriptedModelHandle",
    "apply_docs",
    "ensure_namespace",
    "git_repo",
    "identity_kubeconfig",
    "operator",
    "render_chart",
    "scripted_model",
]

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def get_json(cp: ControlPlane, *args: str) -> dict[str, Any] | None:
    """`kubectl get ARGS -o json`, None when it fails. The common `KIND NAME -n NS` is read
    straight from the API server (`ControlPlane.get_object`): tests poll it many times a
    second, and a kubectl process each time is most of a waiting test's CPU."""
    if len(args) == 4 and args[2] == "-n" and args[0].lower() in controlplane.RESOURCES:
        return cp.get_object(args[0], args[1], args[3])
    done = cp.kubectl("get", *args, "-o", "json", check=False)
    if done.returncode != 0:
        return None
    return dict(json.loads(done.stdout))


# ------------------------------------------------------------------------- scripted model


@dataclass
class ScriptedModelHandle:
    url: str
    process: subprocess.Popen[bytes]

    def load(self, script: dict[str, Any]) -> None:
        load_script(self.url, script)

    def requests(self, conversation: str) -> list[dict[str, Any]]:
        return model_requests(self.url, conversation)


@pytest.fixture(scope="package")
def scripted_model() -> Iterator[ScriptedModelHandle]:
    from corral_dev.ports import free_port

    port = free_port()
    script = Path(tempfile.mkdtemp(prefix="corral-model-")) / "script.yaml"
    script.write_text(yaml.safe_dump({"default": [{"text": "Done."}]}))
    process = stack.start_scripted_model(port, script)
    url = f"http://127.0.0.1:{port}"
    try:
        stack.wait_serving("the scripted model", f"{url}/_requests", process)
        yield ScriptedModelHandle(url, process)
    finally:
        process.terminate()
        process.wait(timeout=10)


# -------------------------------------------------------------------------------- operator


def _no_args() -> list[str]:
    return []


@dataclass
class OperatorExtras:
    """What a tier adds to every `operator` it starts: more arguments (`args()`, called for
    each operator, so a port can be fresh), Secrets created in its namespace first, and
    `credentials` and `hooks` that every Agent applied through `OperatorHandle.apply` gets
    where it names none of its own; `started` is called once the operator serves. The cluster
    tier adds nothing; the attack suite gives its Sessions canary credentials this way (its
    conftest defines an `operator_extras` fixture, which `operator` uses when there is one)."""

    args: Callable[[], list[str]] = _no_args
    secrets: list[dict[str, Any]] = field(default_factory=list)
    credentials: dict[str, Any] = field(default_factory=dict)
    hooks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    started: Callable[[OperatorHandle], None] | None = None

    def agent(self, doc: dict[str, Any]) -> dict[str, Any]:
        """`doc` (an Agent) with the extra credentials and hooks it does not name itself."""
        if doc.get("kind") != "Agent" or not (self.credentials or self.hooks):
            return doc
        doc = copy.deepcopy(doc)
        spec = doc.setdefault("spec", {})
        credentials = spec.setdefault("credentials", {})
        for key, value in self.credentials.items():
            credentials.setdefault(key, copy.deepcopy(value))
        hooks = spec.setdefault("hooks", {})
        for phase, extra in self.hooks.items():
            present = hooks.setdefault(phase, [])
            names = {h.get("name") for h in present}
            present.extend(copy.deepcopy(h) for h in extra if h.get("name") not in names)
        return doc


@dataclass
class OperatorHandle:
    cp: ControlPlane
    namespace: str
    kubeconfig: Path
    args: list[str]
    log: Path
    node: LocalNodeHandle | None = None
    process: subprocess.Popen[bytes] | None = None
    extras: OperatorExtras = field(default_factory=OperatorExtras)

    def start(self) -> None:
        self.process = stack.start_operator(self.args, self.log)

    def kill(self) -> None:
        """SIGKILL: no cleanup, no graceful stop, as a crashed operator."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    # ------------------------------------------------------------------ cluster helpers

    def apply(self, *docs: dict[str, Any]) -> None:
        for doc in docs:
            doc.setdefault("metadata", {})["namespace"] = self.namespace
        applied = [self.extras.agent(doc) for doc in docs]
        self.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(applied))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        return get_json(self.cp, kind, name, "-n", self.namespace)

    def session_status(self, name: str) -> dict[str, Any]:
        return dict((self.get("session", name) or {}).get("status") or {})

    def wait_phase(self, name: str, phases: set[str], timeout: float = 90) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status = self.session_status(name)
            return status if status.get("phase") in phases else None

        try:
            return wait_for(f"session {name} in {sorted(phases)}", probe, timeout)
        except AssertionError as err:
            raise AssertionError(
                f"{err}\nstatus: {self.session_status(name)}\n--- operator log (tail)\n"
                f"{self.logs()[-4000:]}\n{self.pod_logs(f'corral-{name}')}"
            ) from None

    def pod_logs(self, pod: str) -> str:
        """The sandbox's container logs on the local node, for a failure message."""
        if self.node is None:
            return ""
        try:
            logs = self.node.pod_dir(self.namespace, pod) / "logs"
        except FileNotFoundError as missing:
            return str(missing)
        return "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}" for f in sorted(logs.glob("*"))
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        items = self.cp.list_objects(
            "events", self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return sorted(items, key=lambda e: e.get("metadata", {}).get("creationTimestamp", ""))


@pytest.fixture
def operator(
    request: pytest.FixtureRequest,
    control_plane: ControlPlane,
    namespace: str,
    local_node: LocalNodeHandle,
    scripted_model: ScriptedModelHandle,
) -> Iterator[OperatorHandle]:
    """The operator for `namespace`, running under the chart's RBAC, and the sandbox identity;
    with what the tier's `operator_extras` adds, when its conftest defines that fixture."""
    _require_single_pass_remap(local_node)
    try:
        extras: OperatorExtras = request.getfixturevalue("operator_extras")
    except pytest.FixtureLookupError:
        extras = OperatorExtras()
    stack.install_rbac(control_plane, f"corral-{namespace}", namespace)
    if extras.secrets:
        control_plane.kubectl(
            "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(extras.secrets)
        )
    kubeconfig = identity_kubeconfig(control_plane, OPERATOR_NAMESPACE, OPERATOR_SA)
    health = controlplane.free_port()
    log = Path(tempfile.mkdtemp(prefix="corral-operator-")) / "operator.log"
    handle = OperatorHandle(
        control_plane,
        namespace,
        kubeconfig,
        stack.operator_args(
            control_plane,
            kubeconfig=kubeconfig,
            namespaces=[namespace],
            health_port=health,
            model_url=scripted_model.url,
            wire_wait_seconds=5,
        )
        + extras.args(),
        log,
        node=local_node,
        extras=extras,
    )
    handle.start()
    try:
        stack.wait_serving(
            "the operator", f"http://127.0.0.1:{health}/healthz", handle.process, log
        )
        if extras.started is not None:
            extras.started(handle)
        yield handle
    finally:
        handle.stop()  # the `namespace` fixture then deletes what the test left


def _require_single_pass_remap(node: LocalNodeHandle) -> None:
    """The sandbox mounts a volume at /tmp. A node whose workdir is under /tmp must map each
    path once: mapped again, `/var/run/corral/wire/token` would point nowhere. Say so plainly
    instead of timing out on a harness that cannot start."""
    from corral_dev._node_spec import remap

    host = str(node.workdir)
    mapped = remap("/var/run/x", [("/tmp", f"{host}/tmp"), ("/var/run", f"{host}/run")])
    if mapped != f"{host}/run/x":
        pytest.fail(
            f"the local node maps mount paths twice ({mapped!r}) and its workdir {host} is "
            "under the sandbox's /tmp mount; run with TMPDIR outside /tmp "
            "(e.g. TMPDIR=$HOME/.cache/corral/tmp) until corral_dev._node_spec.remap maps "
            "each path in one pass"
        )


# ------------------------------------------------------------------------------ git repo

# Repositories live outside /tmp: the local node maps a container's /tmp (a volume) onto the
# host, so a host path under /tmp in the pod's arguments would point into that volume.
_REPOS = Path.home() / ".cache" / "corral" / "test-repos"


@pytest.fixture
def git_repo() -> Iterator[Path]:
    _REPOS.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="repo-", dir=_REPOS))
    run = {"cwd": path, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q", "-b", "main"], **run)  # type: ignore[call-overload]
    (path / "README.md").write_text("# test repo\n")
    subprocess.run(["git", "add", "README.md"], **run)  # type: ignore[call-overload]
    subprocess.run(  # type: ignore[call-overload]
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init"], **run
    )
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", str(path)], check=False)


def agent_doc(name: str = "coder", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "identity": "You are a careful coding agent.",
        "model": "corral-scripted",
        "tools": {"allow": ["bash"]},
    }
    body.update(spec)
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name},
        "spec": body,
    }


def session_doc(name: str, repo: Path, agent: str = "coder", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agentRef": agent,
        "task": "Say that the task is done.",
        "workspace": {"repo": str(repo), "ref": "main"},
    }
    body.update(spec)
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": name},
        "spec": body,
    }
