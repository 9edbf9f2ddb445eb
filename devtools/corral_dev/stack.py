"""The operator on a local control plane: the chart's RBAC, its identities, the processes.

Shared by `python -m corral_dev up` and the cluster tests. The chart is rendered with
`helm template` and everything but the Deployment is applied to the real API server; the
operator then runs as a local `corral-operator` process that authenticates as
`system:serviceaccount:<ns>:corral-operator` with a client certificate the control plane's CA
signs, so every call it makes is checked against exactly the chart's rules. The model is the
project's scripted server (`python -m corral_dev.scripted`) or a real endpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .controlplane import API_AUDIENCE, REPO_ROOT, ControlPlane

CHART = REPO_ROOT / "charts" / "corral"
KUBE_VERSION = "1.34.4"
OPERATOR_NAMESPACE = "corral-system"
OPERATOR_SA = "corral-operator"
SANDBOX_SA = "corral-sandbox"
VENV_BIN = Path(sys.executable).parent


class StackError(Exception):
    """A part of the operator stack did not come up."""


# ----------------------------------------------------------------------------- the chart


def render_chart(
    cp: ControlPlane, release: str, namespaces: str | Sequence[str], **values: Any
) -> list[dict[str, Any]]:
    """`helm template` of the chart watching `namespaces`, with `values` set as JSON."""
    watched = [namespaces] if isinstance(namespaces, str) else list(namespaces)
    args = [
        str(cp.bin_dir / "helm"),
        "template",
        release,
        str(CHART),
        "--namespace",
        OPERATOR_NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
        "--set-json",
        f"watchNamespaces={json.dumps(watched)}",
    ]
    for key, value in values.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise ValueError(f"helm template failed: {done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def apply_docs(cp: ControlPlane, docs: list[dict[str, Any]]) -> None:
    """Each document applied server-side, in order (every test applies the chart's RBAC, and a
    `kubectl apply` process for it was dear: docs/performance.md, "Test rig")."""
    for doc in docs:
        cp.apply_object(doc)


def ensure_namespace(cp: ControlPlane, name: str) -> None:
    if cp.get_object("namespace", name) is None:
        cp.kubectl("create", "namespace", name, check=False)


def enforce_restricted(cp: ControlPlane, namespace: str) -> None:
    """Pod Security `restricted` enforced in `namespace`, as the sandbox pods are built for."""
    cp.kubectl(
        "label",
        "--overwrite",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )


def install_rbac(cp: ControlPlane, release: str, namespaces: str | Sequence[str]) -> None:
    """The chart's operator and sandbox ServiceAccounts and RBAC; not its Deployment."""
    ensure_namespace(cp, OPERATOR_NAMESPACE)
    docs = render_chart(cp, release, namespaces)
    apply_docs(cp, [d for d in docs if d["kind"] != "Deployment"])


def identity_kubeconfig(cp: ControlPlane, namespace: str, sa: str) -> Path:
    """A client-certificate identity that RBAC sees as the ServiceAccount `namespace/sa`."""
    return cp.user_kubeconfig(
        f"system:serviceaccount:{namespace}:{sa}",
        ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
    )


# ------------------------------------------------------------------------------ processes


def operator_args(
    cp: ControlPlane,
    *,
    kubeconfig: Path,
    namespaces: Sequence[str],
    health_port: int,
    model_url: str,
    wire_wait_seconds: float | None = None,
    local_repo_root: Path | str | None = None,
    model_catalog_configmap: str | None = None,
) -> list[str]:
    """`corral-operator`'s arguments for a local control plane (the API server on 127.0.0.1)."""
    args: list[str] = []
    for namespace in namespaces:
        args += ["--namespace", namespace]
    args += [
        "--kubeconfig",
        str(kubeconfig),
        "--liveness",
        f"http://127.0.0.1:{health_port}/healthz",
        "--model-upstream-url",
        model_url,
        "--kube-api-url",
        cp.server,
        "--token-audience",
        API_AUDIENCE,
    ]
    if wire_wait_seconds is not None:
        args += ["--wire-wait-seconds", str(wire_wait_seconds)]
    if local_repo_root is not None:
        args += ["--local-repo-root", str(local_repo_root)]
    if model_catalog_configmap is not None:
        args += ["--model-catalog-configmap", model_catalog_configmap]
    return args


def start_operator(
    args: Sequence[str], log: Path, *, detach: bool = False
) -> subprocess.Popen[bytes]:
    """`corral-operator` from this venv, its output appended to `log`. It reads no KUBECONFIG
    from the environment (its identity is the --kubeconfig in `args`) and gets no model key
    (that reaches only a custodian, through a Secret). `detach` gives it its own session, so
    it outlives the caller and one signal to its group stops it."""
    env = without_credentials(os.environ)
    return _spawn([str(VENV_BIN / "corral-operator"), *args], log, env=env, detach=detach)


def without_credentials(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less what no local stand-in for a pod or the operator should inherit."""
    return {k: v for k, v in environ.items() if k not in ("KUBECONFIG", "ANTHROPIC_API_KEY")}


def start_scripted_model(
    port: int, script: Path, log: Path | None = None, *, detach: bool = False
) -> subprocess.Popen[bytes]:
    """The project's scripted model server on 127.0.0.1:`port`, replaying `script`."""
    argv = [
        sys.executable,
        "-m",
        "corral_dev.scripted",
        "--port",
        str(port),
        "--script",
        str(script),
    ]
    return _spawn(argv, log, env=dict(os.environ), detach=detach)


def start_local_node(
    kubeconfig: Path,
    workdir: Path,
    node_name: str,
    log: Path | None = None,
    *,
    detach: bool = False,
    shares: tuple[Path, ...] = (),
) -> subprocess.Popen[bytes]:
    """The local node (`python -m corral_dev.localnode`) for the cluster behind `kubeconfig`.

    `shares`: host directories every container sees read-only, such as the local git
    repositories sessions clone (everything else of the host's /tmp and /root is hidden).
    """
    argv = [
        sys.executable,
        "-m",
        "corral_dev.localnode",
        "--kubeconfig",
        str(kubeconfig),
        "--workdir",
        str(workdir),
        "--node-name",
        node_name,
    ]
    for share in shares:
        argv += ["--share", str(share)]
    return _spawn(argv, log, env=without_credentials(os.environ), detach=detach)


def _spawn(
    argv: list[str], log: Path | None, *, env: dict[str, str], detach: bool
) -> subprocess.Popen[bytes]:
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") if log is not None else open(os.devnull, "wb") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=detach,
        )


def process_alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def serving(url: str) -> bool:
    """True when `url` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def wait_serving(
    what: str,
    url: str,
    process: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    timeout: float = 30,
) -> None:
    """Wait until `url` answers 200; fail early, with the log's tail, if `process` exits."""
    deadline = time.monotonic() + timeout
    while not serving(url):
        exited = process is not None and process.poll() is not None
        if exited or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-4000:] if log and log.exists() else ""
            state = "exited" if exited else f"not serving {url} after {timeout:.0f}s"
            raise StackError(f"{what} {state}\n{tail}")
        time.sleep(0.1)
