"""`python -m corral_dev up|down|status`: a local cluster with Corral running, for kubectl users.

`up` starts the control plane (etcd, kube-apiserver, kube-controller-manager), the local node,
the chart's ServiceAccounts, RBAC and model catalog, a model (the scripted demo model, or
Anthropic's API when ANTHROPIC_API_KEY is set) and `corral-operator` as a local process under
the chart's operator identity, watching `default`. It copies examples/demo/repo into a git
repository under `<dev dir>/repos`, serves that directory with `git daemon` on 127.0.0.1
(corral_dev.demo_remote), and runs the operator with `--local-repo-root` set to the daemon's
URL: the examples' `workspace.repo: demo/repo` is cloned from it and each Session's work is
pushed back to its branch there. Every process's pid is recorded in `<dev dir>/pids.json` and
`down` stops them all; logs are in `<dev dir>/state/logs/`. The dev dir is `.corral/dev`, or
$CORRAL_DEV_DIR.

`up --node real` (or NODE=real, as `make dev-cluster NODE=real` passes it) runs the same cluster
on the real node instead (containerd, kubelet, kube-proxy, CoreDNS and kube-router in a network
namespace of their own; root; built by hack/node/ on first use): the operator is then a pod
installed with `helm install` from its image (with `--local-repo-root` added by a helm
post-renderer, the chart having no value for a development flag), and the scripted demo model
and the git daemon listen on this host's address on the link to the node, which sandboxes
reach through the chart's egress gateway.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from . import _realnode_stack as rstack
from . import controlplane, demo_remote, realnode, stack

DEV_DIR = Path(os.environ.get("CORRAL_DEV_DIR", controlplane.REPO_ROOT / ".corral" / "dev"))
PIDS = DEV_DIR / "pids.json"
INFO = DEV_DIR / "info.json"
LOGS = DEV_DIR / "state" / "logs"
REPOS = DEV_DIR / "repos"
EXAMPLES = controlplane.REPO_ROOT / "examples"
NAMESPACE = "default"
RELEASE = "corral"
NODE_NAME = "corral-local-node"
MODEL_CATALOG = "corral-model-catalog"  # the chart's ConfigMap in each sandbox namespace
MODEL_SECRET = "anthropic-api-key"
MODEL_SECRET_KEY = "apiKey"
ANTHROPIC_URL = "https://api.anthropic.com"
NODE_KINDS = ("local", "real")
REAL_NODE_INFO = DEV_DIR / "real-node.json"
REAL_NODE_STOP_GRACE = 120.0  # the node removes its containers, mounts and namespace


def node_kind(given: str | None) -> str:
    """`--node`, else $CORRAL_DEV_NODE, else $NODE when it names a kind (make passes its
    command-line variables to the recipe's environment), else local."""
    for value in (given, os.environ.get("CORRAL_DEV_NODE"), os.environ.get("NODE")):
        if value in NODE_KINDS:
            return str(value)
    return "local"


def _read_pids() -> dict[str, int]:
    try:
        return {str(k): int(v) for k, v in json.loads(PIDS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def _print_exports(info: dict[str, str]) -> None:
    print(f"export KUBECONFIG={DEV_DIR / 'kubeconfig'}")
    print(f"export PATH={info['bin_dir']}:$PATH   # kubectl and helm")


# ------------------------------------------------------------------------------------- up


def up(node: str = "local") -> int:
    pids = _read_pids()
    if pids and INFO.exists() and all(stack.process_alive(p) for p in pids.values()):
        print(f"dev cluster already running (logs in {LOGS})")
        _print_exports(json.loads(INFO.read_text()))
        return 0
    if pids:  # a partial or crashed earlier run: stop what is left before starting afresh
        down()
    shutil.rmtree(DEV_DIR, ignore_errors=True)
    DEV_DIR.mkdir(parents=True)
    pids = {}
    try:
        info = _start_real(pids) if node == "real" else _start(pids)
    except (
        controlplane.ControlPlaneError,
        stack.StackError,
        rstack.StackError,
        realnode.NodeError,
        subprocess.SubprocessError,
    ) as e:
        detail = getattr(e, "stderr", None) or ""
        print(f"dev cluster did not come up: {e}\n{detail}".rstrip(), file=sys.stderr)
        print(f"logs: {LOGS}", file=sys.stderr)
        down()
        return 1
    except BaseException:
        down()
        raise
    print(f"dev cluster up: API server {info['server']}, operator watching '{NAMESPACE}'")
    print(f"  model: {info['model']}" + (" (scripted demo)" if not info["model_secret"] else ""))
    print(f"  logs:  {LOGS}")
    if info.get("node") == "real":
        print(
            f"  node:  the real node {info['node_name']}; the operator is a pod in "
            f"{stack.OPERATOR_NAMESPACE}"
        )
    print(
        f"  repos: {REPOS} served at {info['repo_root']} (the examples' `repo: demo/repo` is "
        f"{info['repo_root']}{demo_remote.DEMO_REPO_PATH}; each Session pushes its branch there)"
    )
    if info["model_secret"]:
        print(
            f"  the key is in Secret {NAMESPACE}/{MODEL_SECRET} (key {MODEL_SECRET_KEY}); an "
            "Agent uses it with spec.credentials.modelSecretRef, e.g. after applying agent.yaml:\n"
            "    kubectl patch agent fixer --type merge -p "
            f'\'{{"spec":{{"credentials":{{"modelSecretRef":{{"name":"{MODEL_SECRET}",'
            f'"key":"{MODEL_SECRET_KEY}"}}}}}}}}\''
        )
    _print_exports(info)
    return 0


def _record(pids: dict[str, int], name: str, pid: int) -> None:
    pids[name] = pid
    PIDS.write_text(json.dumps(pids))


def _start(pids: dict[str, int]) -> dict[str, str]:
    plane = controlplane.start(DEV_DIR / "state")
    for name, proc in plane.processes.items():
        _record(pids, name, proc.pid)
    controlplane.install_crds(plane)
    shutil.copy(plane.kubeconfig, DEV_DIR / "kubeconfig")

    node_log = LOGS / "local-node.log"
    node = stack.start_local_node(
        plane.kubeconfig, DEV_DIR / "node", NODE_NAME, node_log, detach=True
    )
    _record(pids, "local-node", node.pid)

    # The examples' remote: the pods (processes on this host) reach it on loopback.
    demo_remote.demo_repository(REPOS / demo_remote.DEMO_REPO_PATH)
    remote = demo_remote.serve(REPOS, "127.0.0.1", LOGS / "git-daemon.log", detach=True)
    _record(pids, "git-daemon", remote.process.pid)

    # The chart's identities, rules and model catalog, and `default` ready for sandbox pods.
    stack.install_rbac(plane, RELEASE, [NAMESPACE])
    stack.enforce_restricted(plane, NAMESPACE)

    key = os.environ.get("ANTHROPIC_API_KEY")
    if key:
        model_url = os.environ.get("ANTHROPIC_BASE_URL") or ANTHROPIC_URL
        _model_secret(plane, key)
    else:
        port = controlplane.free_port()
        model_url = f"http://127.0.0.1:{port}"
        log = LOGS / "model.log"
        model = stack.start_scripted_model(
            port, EXAMPLES / "demo" / "scenario.yaml", log, detach=True
        )
        _record(pids, "model", model.pid)
        stack.wait_serving("the scripted model", f"{model_url}/_requests", model, log)

    health = controlplane.free_port()
    kubeconfig = stack.identity_kubeconfig(plane, stack.OPERATOR_NAMESPACE, stack.OPERATOR_SA)
    log = LOGS / "operator.log"
    operator = stack.start_operator(
        stack.operator_args(
            plane,
            kubeconfig=kubeconfig,
            namespaces=[NAMESPACE],
            health_port=health,
            model_url=model_url,
            local_repo_root=remote.root_url,
            model_catalog_configmap=MODEL_CATALOG,  # as the chart runs it
        ),
        log,
        detach=True,
    )
    _record(pids, "operator", operator.pid)
    stack.wait_serving(
        "the operator", f"http://127.0.0.1:{health}/healthz", operator, log, timeout=60
    )
    _wait_ready(plane, node, node_log)
    info = {
        "server": plane.server,
        "bin_dir": str(plane.bin_dir),
        "model": model_url,
        "model_secret": f"{NAMESPACE}/{MODEL_SECRET}" if key else "",
        "repo_root": remote.root_url,
    }
    INFO.write_text(json.dumps(info))
    return info


def _start_real(pids: dict[str, int]) -> dict[str, str]:
    """The control plane, the real node in a process of its own, the demo repository and the
    scripted model served on the node link, and the chart installed with helm."""
    reason = realnode.unavailable_reason()
    if reason:
        raise realnode.NodeError(f"the real node cannot run here: {reason}")
    if os.environ.get("ANTHROPIC_API_KEY"):
        print(
            "note: ANTHROPIC_API_KEY is ignored with the real node (its pods have no route "
            "beyond this host); the scripted demo model plays instead",
            file=sys.stderr,
        )
    plane = controlplane.start(DEV_DIR / "state")
    for name, proc in plane.processes.items():
        _record(pids, name, proc.pid)
    controlplane.install_crds(plane)
    shutil.copy(plane.kubeconfig, DEV_DIR / "kubeconfig")

    print("building the real node and Corral's images (cached after the first time)...")
    artifacts = realnode.build()
    artifacts_file = DEV_DIR / "real-node-artifacts.json"
    artifacts_file.write_text(json.dumps(artifacts.values))
    node_log = LOGS / "real-node.log"
    argv = [
        sys.executable, "-m", "corral_dev.realnode",
        "--plane-state", str(plane.state_dir), "--server", plane.server,
        "--bin-dir", str(plane.bin_dir), "--work", str(DEV_DIR / "node"),
        "--artifacts", str(artifacts_file), "--ready", str(REAL_NODE_INFO),
    ]  # fmt: skip
    node = rstack.spawn(argv, node_log, detach=True)
    _record(pids, "real-node", node.pid)
    deadline = time.monotonic() + 300
    while not REAL_NODE_INFO.exists():
        if node.poll() is not None or time.monotonic() > deadline:
            state = "exited" if node.poll() is not None else "not up after 300s"
            raise realnode.NodeError(f"the real node {state}:\n{node_log.read_text()[-4000:]}")
        time.sleep(0.5)
    node_info = json.loads(REAL_NODE_INFO.read_text())
    host = node_info["host_ip"]

    # What a sandbox reaches on this host: the examples' remote and the model.
    demo_remote.demo_repository(REPOS / demo_remote.DEMO_REPO_PATH)
    remote = demo_remote.serve(REPOS, host, LOGS / "git-daemon.log", detach=True)
    _record(pids, "git-daemon", remote.process.pid)
    model_port = rstack.free_port(host)
    model = rstack.start_scripted_model(
        host, model_port, EXAMPLES / "demo" / "scenario.yaml", LOGS / "model.log", detach=True
    )
    _record(pids, "model", model.pid)
    model_url = f"http://{host}:{model_port}"

    # The operator: the chart, installed as a platform team would, watching `default`.
    stack.enforce_restricted(plane, NAMESPACE)
    values = rstack.chart_values(
        operator_image=artifacts["OPERATOR_IMAGE"],
        sandbox_image=artifacts["SANDBOX_IMAGE"],
        namespaces=[NAMESPACE],
        model_url=model_url,
        platform_egress=[f"{host}/32:{model_port},{remote.port}"],
        # This host's address is a private one the gateway refuses unless told so: the
        # checkouts (no custodian credential) reach the git daemon there too.
        gateway_allow=[f"{host}/32"],
    )
    rstack.helm_install(
        plane.bin_dir / "helm",
        plane.kubeconfig,
        RELEASE,
        values,
        operator_args=[f"--local-repo-root={remote.root_url}"],
    )
    info = {
        "server": plane.server,
        "bin_dir": str(plane.bin_dir),
        "model": model_url,
        "model_secret": "",
        "node": "real",
        "node_name": node_info["name"],
        "repo_root": remote.root_url,
    }
    INFO.write_text(json.dumps(info))
    return info


def _wait_ready(
    plane: controlplane.ControlPlane, node: subprocess.Popen[bytes], node_log: Path
) -> None:
    """The node Ready, and `default` holding what a pod needs (its SA, the API server's CA)."""
    deadline = time.monotonic() + 60
    checks = [
        ("get", "node", NODE_NAME, "-o", "jsonpath={.status.conditions[0].status}"),
        ("get", "serviceaccount", "default", "-n", NAMESPACE, "-o", "name"),
        ("get", "configmap", "kube-root-ca.crt", "-n", NAMESPACE, "-o", "name"),
    ]
    for check in checks:
        while True:
            done = plane.kubectl(*check, check=False)
            if done.returncode == 0 and done.stdout.strip() not in ("", "False", "Unknown"):
                break
            if node.poll() is not None:
                raise controlplane.ControlPlaneError(
                    f"the local node exited:\n{node_log.read_text()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise controlplane.ControlPlaneError(f"timed out on kubectl {' '.join(check)}")
            time.sleep(0.2)


def _model_secret(plane: controlplane.ControlPlane, key: str) -> None:
    """The model key as a Secret in the sandbox namespace: only the custodian mounts it."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": MODEL_SECRET, "namespace": NAMESPACE},
        "type": "Opaque",
        "stringData": {MODEL_SECRET_KEY: key},
    }
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(secret))  # on stdin, not in argv


# ----------------------------------------------------------------------------------- down


def down() -> int:
    pids = _read_pids()
    if not pids:
        print("no dev cluster")
        PIDS.unlink(missing_ok=True)
        return 0
    # Last started, first stopped: the operator and model, then the node (it stops its pods'
    # processes while the API server still answers), then the control plane.
    for name, pid in reversed(pids.items()):
        _stop(name, pid, REAL_NODE_STOP_GRACE if name == "real-node" else 20.0)
    PIDS.unlink(missing_ok=True)
    INFO.unlink(missing_ok=True)
    REAL_NODE_INFO.unlink(missing_ok=True)
    print("dev cluster stopped")
    return 0


def _stop(name: str, pid: int, grace: float = 20.0) -> None:
    """SIGTERM the process group `pid` leads, SIGKILL it if it is not gone after `grace`."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if not stack.process_alive(pid):
            return
        if sig == signal.SIGKILL:
            print(f"{name} (pid {pid}) still running {grace:.0f}s after SIGTERM; killing it")
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and stack.process_alive(pid):
            time.sleep(0.1)
    if stack.process_alive(pid):
        print(f"warning: {name} (pid {pid}) did not stop", file=sys.stderr)


def status() -> int:
    pids = _read_pids()
    if not pids:
        print("no dev cluster")
        return 1
    for name, pid in pids.items():
        print(f"{name:<24} pid {pid:<8} {'running' if stack.process_alive(pid) else 'gone'}")
    if INFO.exists():
        _print_exports(json.loads(INFO.read_text()))
    return 0 if all(stack.process_alive(p) for p in pids.values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m corral_dev",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["up", "down", "status", "build"])
    parser.add_argument(
        "--node",
        choices=NODE_KINDS,
        help="up: the local node (default) or the real node (also $CORRAL_DEV_NODE or $NODE)",
    )
    args = parser.parse_args(argv)
    if args.command == "build":
        print(controlplane.binaries())
        return 0
    if args.command == "up":
        return up(node_kind(args.node))
    return {"down": down, "status": status}[args.command]()


if __name__ == "__main__":
    sys.exit(main())
