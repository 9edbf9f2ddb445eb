"""Warm pool benchmark (`make bench`): `kubectl apply` of a Session -> its first model request,
with a warm pool and without, in the same run (docs/warm-pool.md).

Everything is real except the kubelet (the local node runs each pod's containers as processes)
and the model (the project's scripted server): kube-apiserver with RBAC and Pod Security, the
operator as a process under the chart's RBAC, the harness, tools and custodian processes. Two
Agents with the same spec: `warm` keeps a pool, `cold` does not. Each run applies one Session
with the pinned `kubectl apply -f` and measures until the scripted model server RECEIVES the
Session's first request (its own receive timestamp; same host clock). Warm and cold runs
alternate; before each warm run the pool is back to its size and ready, as it would be between
Sessions that do not arrive in a burst.

Run: `.venv/bin/python bench/warm_pool_bench.py [--runs 5] [--pool 2]`. Exit 1 when the warm
median misses the target (1 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from corral_dev import controlplane, stack
from corral_dev.controlplane import ControlPlane

TARGET_WARM_SECONDS = 1.0
# Outside /tmp: the local node maps a container's /tmp mount onto host paths.
WORK = Path.home() / ".cache" / "corral" / "bench"
REPOS = Path.home() / ".cache" / "corral" / "test-repos"
NAMESPACE = "warm-bench"


def _agent(name: str, pool: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "identity": "You are a careful coding agent.",
        "model": "corral-scripted",
        "tools": {"allow": ["bash"]},
    }
    if pool is not None:
        spec["sandbox"] = {"warmPool": {"size": pool}}
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
            "spec": spec}  # fmt: skip


def _session(name: str, agent: str, repo: Path) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"agentRef": agent, "task": "Say done.",
                 "workspace": {"repo": str(repo), "ref": "main"}},
    }  # fmt: skip


def _repo() -> Path:
    REPOS.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="bench-repo-", dir=REPOS))
    for argv in (
        ["git", "init", "-q", "-b", "main"],
        ["sh", "-c", "echo '# bench' > README.md && git add README.md"],
        ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", "init"],
    ):
        subprocess.run(argv, cwd=path, check=True, capture_output=True)
    return path


def _first_request_ts(model_url: str, conversation: str) -> float | None:
    found = httpx.get(f"{model_url}/_requests", params={"conversation": conversation}, timeout=10)
    body = found.json()
    requests = body["requests"] if isinstance(body, dict) else body
    return float(requests[0]["ts"]) if requests else None


def _ready_pool(plane: ControlPlane, agent: str) -> int:
    done = plane.kubectl(
        "get", "pods", "-n", NAMESPACE, "-l",
        f"corral.dev/pool={agent},app.kubernetes.io/component=pool", "-o", "json",
    )  # fmt: skip
    count = 0
    for pod in json.loads(done.stdout)["items"]:
        conditions = (pod.get("status") or {}).get("conditions") or []
        if not pod["metadata"].get("deletionTimestamp") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in conditions
        ):
            count += 1
    return count


def _wait(what: str, probe: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(0.05)


def _one(
    plane: ControlPlane, model_url: str, name: str, agent: str, repo: Path
) -> tuple[float, float]:
    """Seconds from `kubectl apply` starting to the model receiving the first request, and
    the seconds `kubectl apply` itself took (process start, discovery, the request)."""
    manifest = WORK / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump(_session(name, agent, repo)))
    started = time.time()
    plane.kubectl("apply", "-f", str(manifest))
    applied = time.time() - started
    first: list[float] = []

    def arrived() -> bool:
        ts = _first_request_ts(model_url, name)
        if ts is not None:
            first.append(ts)
        return bool(first)

    _wait(f"the first model request of {name}", arrived, 120)
    return first[0] - started, applied


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="Sessions per kind (warm, cold)")
    parser.add_argument("--pool", type=int, default=2, help="the warm Agent's pool size")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="warm-bench-", dir=WORK))
    procs: list[subprocess.Popen[bytes]] = []
    plane = controlplane.start(state / "cp")
    try:
        controlplane.install_crds(plane)
        stack.ensure_namespace(plane, NAMESPACE)
        stack.enforce_restricted(plane, NAMESPACE)
        controlplane.wait_for_default_service_account(plane, NAMESPACE)
        REPOS.mkdir(parents=True, exist_ok=True)
        node = stack.start_local_node(
            plane.kubeconfig, state / "node", "corral-local-node", state / "node.log",
            shares=(REPOS,),
        )  # fmt: skip
        procs.append(node)
        port = controlplane.free_port()
        script = state / "script.yaml"
        script.write_text(yaml.safe_dump({"default": [{"text": "Done."}]}))
        model_url = f"http://127.0.0.1:{port}"
        procs.append(stack.start_scripted_model(port, script, state / "model.log"))
        stack.wait_serving("the scripted model", f"{model_url}/_requests", procs[-1])
        stack.install_rbac(plane, "corral-bench", NAMESPACE)
        kubeconfig = stack.identity_kubeconfig(plane, stack.OPERATOR_NAMESPACE, stack.OPERATOR_SA)
        health = controlplane.free_port()
        operator_args = stack.operator_args(
            plane, kubeconfig=kubeconfig, namespaces=[NAMESPACE], health_port=health,
            model_url=model_url,
        )  # fmt: skip
        procs.append(stack.start_operator(operator_args, state / "operator.log"))
        stack.wait_serving(
            "the operator", f"http://127.0.0.1:{health}/healthz", procs[-1], state / "operator.log"
        )
        docs = [_agent("warm", args.pool), _agent("cold", None)]
        plane.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump_all(docs))
        repo = _repo()
        warm: list[float] = []
        cold: list[float] = []
        kubectl: list[float] = []
        for i in range(args.runs):
            _wait("the warm pool", lambda: _ready_pool(plane, "warm") >= args.pool, 180)
            for kind, into in (("warm", warm), ("cold", cold)):
                total, applied = _one(plane, model_url, f"{kind}-{i}", kind, repo)
                into.append(total)
                kubectl.append(applied)
            print(f"  run {i + 1}: warm {warm[-1]:.3f} s, cold {cold[-1]:.3f} s", flush=True)
        warm_median, cold_median = statistics.median(warm), statistics.median(cold)
        verdict = "ok" if warm_median < TARGET_WARM_SECONDS else "TARGET MISSED"
        print(
            f"kubectl apply -> first model request, local node, {args.runs} Sessions each, "
            f"pool {args.pool}:\n"
            f"  warm (adopted pool pod): median {warm_median:.3f} s "
            f"(min {min(warm):.3f}, max {max(warm):.3f})  target < {TARGET_WARM_SECONDS:.1f} s "
            f"{verdict}\n"
            f"  cold (new pod):          median {cold_median:.3f} s "
            f"(min {min(cold):.3f}, max {max(cold):.3f})\n"
            f"  of which `kubectl apply` itself: median {statistics.median(kubectl):.3f} s; "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
        return 0 if warm_median < TARGET_WARM_SECONDS else 1
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        plane.stop()


if __name__ == "__main__":
    sys.exit(main())
