"""Operator benchmark (`make bench`): how fast a Session gets its pod and its first turn, and how
the operator copes with 200 Sessions applied at once.

Part 1, real path (20 Sessions, one after another): kube-apiserver, the operator under the
chart's RBAC, the local node running the harness and custodian processes, the scripted model.
Measured per Session from the POST that `kubectl apply` would send: (a) until the sandbox pod
exists (the pod's ADDED watch event), (b) until the first turn is admitted (the Session's
status first carries `startedAt`, written right after the harness accepted the admission).

Part 2, scale (200 Sessions in one burst): 200 real sandbox pods would be 400 Python processes,
more than two cores start in a minute, so a BENCH BINDER (a fake kubelet, named as such: it
only marks pods Ready on their own loopback IP) stands in for the node, and ONE real harness
listening on 0.0.0.0:<harness port> answers the wire for every pod. The operator's side is
unchanged: pods, status, readiness, the wire. Measured: time until all 200 are Running (first
turn admitted), and the operator's peak resident memory (VmHWM).

Run: `.venv/bin/python bench/operator_bench.py [--sessions 20] [--burst 200]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from corral_dev import controlplane, stack

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# Outside /tmp: the local node maps a container's /tmp mount onto host paths.
WORK = Path.home() / ".cache" / "corral" / "bench"


class Api:
    """Admin access to the API server with the control plane's client certificate."""

    def __init__(self, kubeconfig: Path) -> None:
        cfg = json.loads(kubeconfig.read_text())
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        self.server = cluster["server"]
        tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
        tls.load_cert_chain(user["client-certificate"], user["client-key"])
        self.http = httpx.Client(base_url=self.server, verify=tls, timeout=30)

    def post(self, path: str, body: dict[str, Any]) -> None:
        self.http.post(path, json=body).raise_for_status()

    def watch(self, path: str, on_event: Any, stop: threading.Event) -> None:
        params = {"watch": "1", "allowWatchBookmarks": "false"}
        try:
            with self.http.stream("GET", path, params=params, timeout=None) as response:
                for line in response.iter_lines():
                    if stop.is_set():
                        return
                    if line:
                        on_event(time.perf_counter(), json.loads(line))
        except httpx.HTTPError:
            if not stop.is_set():  # the control plane stopping ends every watch
                raise


def _session(name: str, repo: Path) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": name},
        "spec": {"agentRef": "coder", "task": "Say done.", "workspace": {"repo": str(repo)}},
    }


def _agent() -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "coder"},
        "spec": {"identity": "You code.", "model": "corral-scripted"},
    }


def _wait(what: str, probe: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(0.05)


def _free(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code < 500
    except httpx.HTTPError:
        return False


def start_operator(
    plane: controlplane.ControlPlane, ns: str, model_url: str, log: Path
) -> subprocess.Popen[bytes]:
    chart = subprocess.run(
        [
            str(plane.bin_dir / "helm"),
            "template",
            "corral",
            str(ROOT / "charts/corral"),
            "--namespace",
            "corral-system",
            "--kube-version",
            "1.34.4",
            "--set-json",
            f"watchNamespaces={json.dumps([ns])}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(chart) if d and d["kind"] != "Deployment"]
    plane.kubectl("create", "namespace", "corral-system", check=False)
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    identity = plane.user_kubeconfig(
        "system:serviceaccount:corral-system:corral-operator",
        ["system:serviceaccounts", "system:serviceaccounts:corral-system", "system:authenticated"],
    )
    health = controlplane.free_port()
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    proc = subprocess.Popen(
        [
            str(BIN / "corral-operator"),
            "-n",
            ns,
            "--kubeconfig",
            str(identity),
            "--liveness",
            f"http://127.0.0.1:{health}/healthz",
            "--model-upstream-url",
            model_url,
            "--kube-api-url",
            plane.server,
            "--token-audience",
            controlplane.API_AUDIENCE,
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    _wait("the operator", lambda: _free(f"http://127.0.0.1:{health}/healthz"), 60)
    return proc


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_repo() -> Path:
    repo = WORK / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    git = ["git", "-C", str(repo)]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run(
        [
            *git,
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "init",
        ],
        check=True,
    )
    return repo


def new_namespace(plane: controlplane.ControlPlane, name: str) -> None:
    plane.kubectl("create", "namespace", name)
    plane.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    controlplane.wait_for_default_service_account(plane, name)


# ------------------------------------------------------------------------------ part 1


def part_one(plane: controlplane.ControlPlane, api: Api, model_url: str, n: int) -> dict[str, Any]:
    ns = "bench-real"
    new_namespace(plane, ns)
    node_dir = WORK / "node"
    shutil.rmtree(node_dir, ignore_errors=True)
    repo = make_repo()
    # The node hides root's home from its containers; the repository is shared read-only.
    node = stack.start_local_node(
        plane.kubeconfig, node_dir, "bench-node", WORK / "node.log", shares=(repo,)
    )
    operator = start_operator(plane, ns, model_url, WORK / "operator-real.log")
    pod_seen: dict[str, float] = {}
    admitted: dict[str, float] = {}
    stop = threading.Event()

    def on_pod(t: float, ev: dict[str, Any]) -> None:
        name = ev["object"]["metadata"]["name"]
        pod_seen.setdefault(name, t)

    def on_session(t: float, ev: dict[str, Any]) -> None:
        obj = ev["object"]
        if (obj.get("status") or {}).get("startedAt"):
            admitted.setdefault(obj["metadata"]["name"], t)

    for path, handler in (
        (f"/api/v1/namespaces/{ns}/pods", on_pod),
        (f"/apis/corral.dev/v1alpha1/namespaces/{ns}/sessions", on_session),
    ):
        threading.Thread(target=api.watch, args=(path, handler, stop), daemon=True).start()
    try:
        api.post(f"/apis/corral.dev/v1alpha1/namespaces/{ns}/agents", _agent())
        time.sleep(1.0)  # the Agent is validated once, before the clock starts
        to_pod: list[float] = []
        to_turn: list[float] = []
        for i in range(n):
            name = f"s{i:03d}"
            t0 = time.perf_counter()
            api.post(f"/apis/corral.dev/v1alpha1/namespaces/{ns}/sessions", _session(name, repo))
            _wait(f"pod of {name}", lambda nm=f"corral-{name}": nm in pod_seen, 60)
            _wait(f"first turn of {name}", lambda nm=name: nm in admitted, 120)
            to_pod.append((pod_seen[f"corral-{name}"] - t0) * 1000)
            to_turn.append((admitted[name] - t0) * 1000)
        return {
            "sessions": n,
            "apply_to_pod_ms_median": round(statistics.median(to_pod), 1),
            "apply_to_pod_ms_max": round(max(to_pod), 1),
            "apply_to_first_turn_ms_median": round(statistics.median(to_turn), 1),
            "apply_to_first_turn_ms_max": round(max(to_turn), 1),
            "operator_peak_rss_mb": round(peak_rss_mb(operator.pid), 1),
        }
    finally:
        stop.set()
        operator.terminate()
        node.terminate()
        operator.wait(timeout=20)
        node.wait(timeout=30)


# ------------------------------------------------------------------------------ part 2


def bench_binder(api: Api, ns: str, stop: threading.Event) -> None:
    """BENCH BINDER, a fake kubelet: marks each sandbox pod Running and Ready on its own
    loopback IP. Nothing runs in the pod; one shared real harness answers every IP."""
    counter = iter(range(1, 60000))

    def on_pod(_t: float, ev: dict[str, Any]) -> None:
        pod = ev["object"]
        if ev["type"] != "ADDED" or (pod.get("status") or {}).get("podIP"):
            return
        i = next(counter)
        ip = f"127.{100 + i // 250}.{i % 250 + 1}.1"
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "127.0.0.1",
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
        }
        name = pod["metadata"]["name"]
        api.http.patch(
            f"/api/v1/namespaces/{ns}/pods/{name}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()

    api.watch(f"/api/v1/namespaces/{ns}/pods", on_pod, stop)


def part_two(plane: controlplane.ControlPlane, api: Api, model_url: str, n: int) -> dict[str, Any]:
    ns = "bench-burst"
    new_namespace(plane, ns)
    if _free("http://127.0.0.1:8080/readyz"):
        raise SystemExit("bench: port 8080 is taken; the shared harness needs it")
    state = WORK / "harness-state"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    harness = subprocess.Popen(
        [str(BIN / "corral-harness")],
        env={
            **os.environ,
            "CORRAL_HARNESS_ADDR": "0.0.0.0:8080",
            "CORRAL_STATE_DIR": str(state),
            "CORRAL_GRANTED_ROOT": str(make_repo()),
            "ANTHROPIC_BASE_URL": model_url,
        },
        stdout=(WORK / "harness.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    _wait("the shared harness", lambda: _free("http://127.0.0.1:8080/readyz"), 60)
    stop = threading.Event()
    threading.Thread(target=bench_binder, args=(api, ns, stop), daemon=True).start()
    operator = start_operator(plane, ns, model_url, WORK / "operator-burst.log")
    running: dict[str, float] = {}

    def on_session(t: float, ev: dict[str, Any]) -> None:
        obj = ev["object"]
        if (obj.get("status") or {}).get("startedAt"):
            running.setdefault(obj["metadata"]["name"], t)

    threading.Thread(
        target=api.watch,
        args=(f"/apis/corral.dev/v1alpha1/namespaces/{ns}/sessions", on_session, stop),
        daemon=True,
    ).start()
    try:
        api.post(f"/apis/corral.dev/v1alpha1/namespaces/{ns}/agents", _agent())
        time.sleep(1.0)
        repo = WORK / "repo"
        docs = [_session(f"b{i:03d}", repo) for i in range(n)]
        for doc in docs:
            doc["metadata"]["namespace"] = ns
        t0 = time.perf_counter()
        plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), timeout=120)
        applied = time.perf_counter() - t0
        try:
            _wait(f"{n} sessions running", lambda: len(running) >= n, 60 + n)
        except SystemExit:
            out = plane.kubectl("get", "sessions", "-n", ns, "--no-headers", check=False).stdout
            print("\n".join(out.splitlines()[:10]), file=sys.stderr)
            raise
        return {
            "sessions": n,
            "kubectl_apply_s": round(applied, 2),
            "all_running_s": round(max(running.values()) - t0, 2),
            "operator_peak_rss_mb": round(peak_rss_mb(operator.pid), 1),
        }
    finally:
        stop.set()
        operator.terminate()
        harness.terminate()
        operator.wait(timeout=30)
        harness.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--burst", type=int, default=200)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    plane = controlplane.start(Path(tempfile.mkdtemp(prefix="cp-", dir=WORK)))
    model = None
    try:
        controlplane.install_crds(plane)
        script = WORK / "script.yaml"
        script.write_text(yaml.safe_dump({"default": [{"text": "Done."}]}))
        port = controlplane.free_port()
        model = stack.start_scripted_model(port, script)
        model_url = f"http://127.0.0.1:{port}"
        _wait("the scripted model", lambda: _free(f"{model_url}/_requests"), 60)
        api = Api(plane.kubeconfig)
        results: dict[str, Any] = {}
        if args.sessions:
            results["real_path"] = part_one(plane, api, model_url, args.sessions)
            print(json.dumps(results["real_path"]), flush=True)
        if args.burst:
            results["burst"] = part_two(plane, api, model_url, args.burst)
            print(json.dumps(results["burst"]), flush=True)
        print(json.dumps(results, indent=2))
        return 0
    finally:
        if model is not None:
            model.terminate()
        plane.stop()


if __name__ == "__main__":
    sys.exit(main())
