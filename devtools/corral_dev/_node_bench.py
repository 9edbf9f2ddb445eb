"""Benchmarks for the local node and the custodian: `python -m corral_dev._node_bench`.

Local node: 20 pods applied one after another (a Python HTTP server with a readiness probe),
median time from the create call to bound, Running and Ready; then all 20 deleted, time until
every pod object is gone. Custodian: median added latency of the model proxy over the scripted
model, streamed and not. Prints one line per figure.
"""

from __future__ import annotations

import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from . import controlplane
from .ports import free_port


def _pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i}", "namespace": "bench"},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "web",
                    "image": "ignored",
                    "command": ["python", "-m", "http.server", "--bind", "$(IP)", "8080"],
                    "env": [
                        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ],
                    "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
                }
            ],
        },
    }


def bench_node(pods: int = 20) -> None:
    state = Path(tempfile.mkdtemp(prefix="corral-node-bench-"))
    plane = controlplane.start(state)
    with (state / "node.log").open("wb") as log:
        node = subprocess.Popen(
            [sys.executable, "-m", "corral_dev.localnode", "--kubeconfig", str(plane.kubeconfig),
             "--workdir", str(state / "node")],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        plane.kubectl("create", "namespace", "bench")
        controlplane.wait_for_default_service_account(plane, "bench")
        while plane.kubectl("get", "node", "corral-local-node", check=False).returncode:
            time.sleep(0.1)
        tls = ssl.create_default_context(cafile=str(plane.ca_file))
        pki = state / "pki"
        tls.load_cert_chain(str(pki / "user-corral-admin.crt"), str(pki / "user-corral-admin.key"))
        bound: list[float] = []
        running: list[float] = []
        ready: list[float] = []
        with httpx.Client(base_url=plane.server, verify=tls) as api:
            for i in range(pods):
                started = time.monotonic()
                api.post("/api/v1/namespaces/bench/pods", json=_pod(i)).raise_for_status()
                seen: dict[str, float] = {}
                while "ready" not in seen:
                    pod = api.get(f"/api/v1/namespaces/bench/pods/p{i}").json()
                    now = time.monotonic() - started
                    status = pod.get("status", {})
                    if pod["spec"].get("nodeName"):
                        seen.setdefault("bound", now)
                    if status.get("phase") == "Running":
                        seen.setdefault("running", now)
                    if any(
                        c["type"] == "Ready" and c["status"] == "True"
                        for c in status.get("conditions", [])
                    ):
                        seen["ready"] = now
                    time.sleep(0.005)
                bound.append(seen["bound"])
                running.append(seen.get("running", seen["ready"]))
                ready.append(seen["ready"])
            started = time.monotonic()
            for i in range(pods):
                api.delete(f"/api/v1/namespaces/bench/pods/p{i}")
            while api.get("/api/v1/namespaces/bench/pods").json()["items"]:
                time.sleep(0.02)
            gone = time.monotonic() - started
        ms = {
            k: statistics.median(v) * 1000 for k, v in (("b", bound), ("r", running), ("y", ready))
        }
        print(
            f"local node, median of {pods}: create->bound {ms['b']:.0f} ms,"
            f" ->Running {ms['r']:.0f} ms, ->Ready {ms['y']:.0f} ms"
        )
        print(f"local node: {pods} pods deleted -> all gone in {gone:.2f} s")
    finally:
        node.terminate()
        node.wait(timeout=20)
        plane.stop()


def bench_custodian(requests: int = 60) -> None:
    from corral_dev.scripted import ScriptedModel, parse_script, serve_in_thread

    upstream = serve_in_thread(ScriptedModel(parse_script({"default": [{"text": "hi"}] * 500})))
    port = free_port()
    state = Path(tempfile.mkdtemp(prefix="corral-custodian-bench-"))
    # The custodian answers only the pod credential, and allows only its Agent's model.
    credential = state / "credential"
    credential.write_text("bench-pod-credential-0123456789abcdef\n")
    credential.chmod(0o600)
    agent = {"identity": "bench", "model": "claude-haiku-4-5", "tools": {"allow": []}}
    env = {
        "PATH": os.environ.get("PATH", ""),
        "CORRAL_CUSTODIAN_ADDR": f"127.0.0.1:{port}",
        "CORRAL_UPSTREAM_URL": upstream.url,
        "ANTHROPIC_API_KEY": "bench-key",
        "CORRAL_STATE_DIR": str(state / "custodian"),
        "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(credential),
        "CORRAL_AGENT_SPEC_JSON": json.dumps(agent),
    }
    started = time.monotonic()
    custodian = subprocess.Popen([str(Path(sys.executable).parent / "corral-custodian")], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.02)
        print(f"custodian: start to ready {time.monotonic() - started:.2f} s")
        body = {"model": "claude-haiku-4-5", "max_tokens": 10,
                "messages": [{"role": "user", "content": "x"}]}  # fmt: skip

        def median_ms(base: str, stream: bool) -> float:
            times = []
            headers = {"x-api-key": "bench-pod-credential-0123456789abcdef"}
            with httpx.Client(headers=headers) as client:
                for _ in range(requests):
                    t0 = time.perf_counter()
                    client.post(base + "/v1/messages", json={**body, "stream": stream}).read()
                    times.append(time.perf_counter() - t0)
            return statistics.median(times[10:]) * 1000

        for stream in (False, True):
            direct, proxied = median_ms(upstream.url, stream), median_ms(url, stream)
            added = proxied - direct
            print(
                f"custodian proxy, stream={stream}: direct {direct:.1f} ms, through the "
                f"custodian {proxied:.1f} ms, added {added:.1f} ms (median)"
            )
    finally:
        custodian.terminate()
        custodian.wait(timeout=10)
        upstream.stop()


if __name__ == "__main__":
    bench_custodian()
    bench_node()
