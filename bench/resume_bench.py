"""Resume benchmark (`make bench`): a Session's sandbox pod is deleted mid-turn -> the next
model request of the Session, from its new pod (docs/turns.md, "A lost pod"; ADR 0104).

Everything is real except the kubelet (the local node runs each pod's containers as processes)
and the model (the project's scripted server): kube-apiserver with RBAC and Pod Security, the
operator as a process under the chart's RBAC with an archive directory, the harness, tools and
custodian processes. Each run applies one Session whose first model request the scripted model
holds (the turn is in flight); once that request has arrived and the turn's admission is in
the archive, the pod is deleted with the pinned `kubectl delete --wait=false`, and the figure
runs until the scripted model RECEIVES the Session's next request (its own receive timestamp;
same host clock): the operator sees the pod go, plans the resume, makes the new pod (checkout
at the delivered revision), the new harness starts, is given the archived conversation, and
the interrupted turn is admitted again. Each Session must then end Succeeded with one restart.

Run: `.venv/bin/python bench/resume_bench.py [--runs 5]`. Exit 1 when the median misses the
target (10 s) or a Session does not end Succeeded after one restart.
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

TARGET_SECONDS = 10.0
HELD_SECONDS = 90  # the first request's answer: never awaited, the pod goes before it
# Outside /tmp: the local node maps a container's /tmp mount onto host paths.
WORK = Path.home() / ".cache" / "corral" / "bench"
REPOS = Path.home() / ".cache" / "corral" / "test-repos"
NAMESPACE = "resume-bench"


def _agent() -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "coder", "namespace": NAMESPACE},
        "spec": {"identity": "You are a careful coding agent.", "model": "corral-scripted",
                 "tools": {"allow": ["bash"]}},
    }  # fmt: skip


def _session(name: str, repo: Path) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"agentRef": "coder", "task": "Say done.",
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


def _requests(model_url: str, conversation: str) -> list[dict[str, Any]]:
    found = httpx.get(f"{model_url}/_requests", params={"conversation": conversation}, timeout=10)
    body = found.json()
    return list(body["requests"] if isinstance(body, dict) else body)


def _status(plane: ControlPlane, name: str) -> dict[str, Any]:
    done = plane.kubectl("get", "session", name, "-n", NAMESPACE, "-o", "json")
    status: dict[str, Any] = json.loads(done.stdout).get("status") or {}
    return status


def _wait(what: str, probe: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(0.05)


def _archived(archive: Path, name: str, submission: str) -> bool:
    runs = archive / NAMESPACE / name
    return any(submission in c.read_text() for c in runs.glob(".conversation-*/*.ndjson"))


def _one(plane: ControlPlane, model_url: str, archive: Path, name: str, repo: Path) -> float:
    """Seconds from the pod's deletion to the model receiving the resumed turn's request."""
    httpx.post(
        f"{model_url}/_script",
        json={"conversations": {name: [
            {"text": "never seen: the pod goes first", "delay": HELD_SECONDS},
            {"text": "Done after the resume."},
        ]}},
        timeout=10,
    ).raise_for_status()  # fmt: skip
    manifest = WORK / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump(_session(name, repo)))
    plane.kubectl("apply", "-f", str(manifest))
    _wait(f"{name}'s first model request", lambda: _requests(model_url, name), 120)
    ledger = _wait(f"{name}'s turn in flight", lambda: _status(plane, name).get("ledger"), 60)
    _wait(
        f"{name}'s admission archived",
        lambda: _archived(archive, name, ledger["submissionId"]),
        60,
    )
    deleted = time.time()
    plane.kubectl("delete", "pod", f"corral-{name}", "-n", NAMESPACE, "--wait=false")
    again = _wait(
        f"{name}'s request from its new pod",
        lambda: (r := _requests(model_url, name)) and len(r) >= 2 and r[1],
        120,
    )
    seconds = float(again["ts"]) - deleted
    status = _wait(
        f"{name} to end",
        lambda: (s := _status(plane, name)).get("phase") in ("Succeeded", "Failed") and s,
        120,
    )
    if status["phase"] != "Succeeded" or status.get("restarts") != 1:
        raise SystemExit(f"bench: {name} ended {status.get('phase')}: {status.get('message')}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="Sessions whose pod is deleted")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="resume-bench-", dir=WORK))
    archive = state / "archive"
    archive.mkdir()
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
        operator_args = [
            *stack.operator_args(
                plane, kubeconfig=kubeconfig, namespaces=[NAMESPACE], health_port=health,
                model_url=model_url,
            ),
            "--archive-dir", str(archive),
        ]  # fmt: skip
        procs.append(stack.start_operator(operator_args, state / "operator.log"))
        stack.wait_serving(
            "the operator", f"http://127.0.0.1:{health}/healthz", procs[-1], state / "operator.log"
        )
        plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(_agent()))
        repo = _repo()
        figures: list[float] = []
        for i in range(args.runs):
            figures.append(_one(plane, model_url, archive, f"resume-{i}", repo))
            print(f"  run {i + 1}: pod deleted -> next model request {figures[-1]:.3f} s",
                  flush=True)  # fmt: skip
        median = statistics.median(figures)
        verdict = "PASS" if median <= TARGET_SECONDS else "MISS"
        print(
            f"resume: pod deleted mid-turn -> the resumed turn's model request, local node, "
            f"{args.runs} Sessions: median {median:.3f} s (min {min(figures):.3f}, max "
            f"{max(figures):.3f}) target <= {TARGET_SECONDS:.0f} s {verdict}; every Session "
            f"Succeeded after one restart; load average {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} cores"
        )
        return 0 if verdict == "PASS" else 1
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
