"""Operator benchmark (`make bench`): 1,000 Sessions in one burst, and 50 on real local pods.

Both parts run the real `corral-operator` process under the chart's RBAC against the local
control plane (etcd + kube-apiserver + kube-controller-manager), apply the Sessions with the
pinned `kubectl apply`, and take every timestamp from this process's own watches on Sessions
and Pods (not `creationTimestamp`, whose resolution is a second):

- apply -> pod: from the Session's ADDED event (the moment `kubectl apply` created it) to its
  sandbox pod's ADDED event;
- apply -> first turn admitted: to the first Session event whose status carries `startedAt`
  (written right after the harness accepted the admission);
- all admitted: from the start of `kubectl apply` until the last Session's first admission;
- the operator's peak resident memory (VmHWM) and CPU seconds (utime + stime);
- API requests per Session: the operator identity's requests in the API server's audit log,
  from the start of `kubectl apply` until every Session has finished and its pod is gone,
  divided by the number of Sessions (with the top request kinds).

Part A (`--burst`, default 1,000): the sandbox side is the STAND-IN SANDBOX
(`corral_dev._standin_sandbox`): one process marks each sandbox pod Ready on an address of its
own and answers the harness wire and the custodian's usage endpoint there, with the wire's real
shapes and each pod's own token; its turns settle `completed` after `--turn-seconds`. 1,000 real
pods would be 3,000 processes, more than two cores and 24 GiB hold.

Part B (`--local-node`, default 50): real sandbox pods on the local node (harness, tools and
custodian processes per pod, the scripted model behind the custodian), all applied at once.

Targets (part A): all admitted within 120 s, operator RSS under 400 MB, p99 apply -> pod under
2 s. Each prints PASS or MISS; a MISS makes the exit status 1 (so `make bench` lists it at
the end) unless `--lenient`.

Run: `.venv/bin/python bench/operator_bench.py [--burst 1000] [--local-node 50] [--lenient]`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import resource
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from corral_dev import controlplane, stack

ROOT = Path(__file__).resolve().parents[1]
# Outside /tmp: the local node maps a container's /tmp mount onto host paths.
WORK = Path.home() / ".cache" / "corral" / "bench"
OPERATOR_USER = f"system:serviceaccount:{stack.OPERATOR_NAMESPACE}:{stack.OPERATOR_SA}"
TARGET_ALL_ADMITTED_S = 120.0
TARGET_RSS_MB = 400.0
TARGET_P99_POD_MS = 2000.0
TIMELINE_SECONDS = 10.0
STANDIN_NICENESS = 10
# The bench's watch threads (the client whose clock the figures read): ahead of the machine.
WATCH_NICENESS = -5


# ------------------------------------------------------------------------------- watching


@dataclass
class Clock:
    """Client-side timestamps (perf_counter) of what the watches saw, per Session name."""

    applied: dict[str, float] = field(default_factory=dict)
    pod: dict[str, float] = field(default_factory=dict)
    admitted: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    pods_gone: set[str] = field(default_factory=set)
    phases: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_session(self, t: float, event: dict[str, Any]) -> None:
        obj = event["object"]
        name = obj["metadata"]["name"]
        status = obj.get("status") or {}
        with self.lock:
            self.applied.setdefault(name, t)
            if status.get("startedAt"):
                self.admitted.setdefault(name, t)
            phase = status.get("phase") or ""
            self.phases[name] = phase
            if phase in ("Succeeded", "Failed", "Stopped"):
                self.finished.setdefault(name, t)

    def on_pod(self, t: float, event: dict[str, Any]) -> None:
        session = (event["object"]["metadata"].get("labels") or {}).get("corral.dev/session")
        if not session:
            return
        with self.lock:
            self.pod.setdefault(session, t)
            if event["type"] == "DELETED":
                self.pods_gone.add(session)


def _label(line: str, name: str) -> str:
    """A label's value in one line of Prometheus text (`series{name="value",...} 1`)."""
    return line.split(f'{name}="', 1)[1].split('"', 1)[0]


# A watch's objects as their metadata alone (PartialObjectMetadata).
_METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class Api:
    """Admin access to the API server with the control plane's client certificate."""

    def __init__(self, kubeconfig: Path) -> None:
        cfg = json.loads(kubeconfig.read_text())
        cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
        tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
        tls.load_cert_chain(user["client-certificate"], user["client-key"])
        self.http = httpx.Client(base_url=cluster["server"], verify=tls, timeout=30)

    def watch(
        self, path: str, on_event: Any, stop: threading.Event, *, metadata_only: bool = False
    ) -> None:
        """Every event of `path`, for as long as `stop` is not set. The API server ends a watch
        now and then (its timeout, a slow reader under load): the watch resumes from the last
        resourceVersion seen, so no event is lost; after a 410 it lists again (what changed in
        between is then timed at the list, later than it happened). `metadata_only`: the
        objects' metadata alone, which the API server encodes and this process decodes in a
        fraction of the time (pods are some 10 kB each)."""
        version = ""
        headers = {"Accept": _METADATA_ONLY} if metadata_only else {}
        # This thread stands in for a client on another machine: at the machine's priority it
        # read events late under the burst's load, up to a second later than the API server's
        # audit log shows them happening. The processes under test keep theirs.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WATCH_NICENESS)
        while not stop.is_set():
            params = {"watch": "1", "allowWatchBookmarks": "true"}
            if version:
                params["resourceVersion"] = version
            try:
                with self.http.stream(
                    "GET", path, params=params, headers=headers, timeout=None
                ) as response:
                    for line in response.iter_lines():
                        if stop.is_set():
                            return
                        if not line:
                            continue
                        seen = time.perf_counter()  # as the line arrives, before decoding
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            version = self._relist(path, on_event, headers)
                            break
                        version = event["object"]["metadata"].get("resourceVersion", version)
                        if event["type"] != "BOOKMARK":
                            on_event(seen, event)
            except httpx.HTTPError:
                if stop.is_set():  # the control plane stopping ends every watch
                    return
                time.sleep(0.2)

    def _relist(self, path: str, on_event: Any, headers: dict[str, str]) -> str:
        listed = self.http.get(path, headers=headers).json()
        now = time.perf_counter()
        for item in listed.get("items") or []:
            on_event(now, {"type": "MODIFIED", "object": item})
        return str(listed["metadata"]["resourceVersion"])

    def queue_waits(self) -> dict[str, tuple[float, float]]:
        """API Priority and Fairness: (seconds waited in total, requests) per priority level,
        from the API server's /metrics (requests that were executed)."""
        waits: dict[str, list[float]] = {}
        name = "apiserver_flowcontrol_request_wait_duration_seconds"
        for line in self.http.get("/metrics").text.splitlines():
            for suffix, slot in (("_sum{", 0), ("_count{", 1)):
                if line.startswith(name + suffix) and 'execute="true"' in line:
                    level = _label(line, "priority_level")
                    waits.setdefault(level, [0.0, 0.0])[slot] += float(line.rsplit(" ", 1)[1])
        return {level: (total, count) for level, (total, count) in waits.items()}

    def start_watches(self, ns: str, clock: Clock, stop: threading.Event) -> None:
        # Of a pod the bench reads its label, its arrival and its deletion: metadata suffices.
        # A Session's status says when its first turn was admitted: all of it.
        for path, handler, metadata_only in (
            (f"/api/v1/namespaces/{ns}/pods", clock.on_pod, True),
            (f"/apis/corral.dev/v1alpha1/namespaces/{ns}/sessions", clock.on_session, False),
        ):
            threading.Thread(
                target=self.watch,
                args=(path, handler, stop),
                kwargs={"metadata_only": metadata_only},
                daemon=True,
            ).start()


# ------------------------------------------------------------------------ the operator


@dataclass
class ProcessMeter:
    """Peak resident memory and CPU seconds of one process, read from /proc."""

    pid: int
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0

    def read(self) -> None:
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
            status = Path(f"/proc/{self.pid}/status").read_text().splitlines()
        except OSError:
            return
        ticks = os.sysconf("SC_CLK_TCK")
        self.cpu_s = (int(stat[11]) + int(stat[12])) / ticks  # utime, stime
        for line in status:
            if line.startswith("VmHWM:"):
                self.peak_rss_mb = int(line.split()[1]) / 1024


def start_operator(
    plane: controlplane.ControlPlane, ns: str, model_url: str, log: Path, metrics_port: int
) -> subprocess.Popen[bytes]:
    """The operator as the cluster tests start it: the chart's RBAC, its own identity; its
    metrics served on `metrics_port` (the bench reads the collector's pauses there)."""
    stack.install_rbac(plane, f"corral-{ns}", ns)
    kubeconfig = stack.identity_kubeconfig(plane, stack.OPERATOR_NAMESPACE, stack.OPERATOR_SA)
    health = controlplane.free_port()
    args = stack.operator_args(
        plane, kubeconfig=kubeconfig, namespaces=[ns], health_port=health, model_url=model_url
    )
    args += ["--metrics-addr", f"127.0.0.1:{metrics_port}"]
    profile = os.environ.get("CORRAL_BENCH_PROFILE_OPERATOR")
    if profile:  # cProfile of the operator's main thread (its event loop), written at exit
        binary = stack.VENV_BIN / "corral-operator"
        env = stack.without_credentials(os.environ)
        command = [sys.executable, "-m", "cProfile", "-o", profile, str(binary), *args]
        proc = subprocess.Popen(command, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)
    else:
        proc = stack.start_operator(args, log)
    stack.wait_serving("the operator", f"http://127.0.0.1:{health}/healthz", proc, log, 60)
    return proc


class AuditCounter:
    """The operator identity's requests in the API server's audit log, between two marks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mark = 0
        self.by_user: collections.Counter[str] = collections.Counter()  # every identity's

    def start(self) -> None:
        self.mark = self.path.stat().st_size if self.path.exists() else 0

    def count(self) -> collections.Counter[str]:
        kinds: collections.Counter[str] = collections.Counter()
        self.by_user = collections.Counter()
        with self.path.open("rb") as log:
            log.seek(self.mark)
            for line in log:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line still being written
                user = entry.get("user", {}).get("username", "?")
                self.by_user[user] += 1
                if user != OPERATOR_USER:
                    continue
                ref = entry.get("objectRef") or {}
                what = ref.get("resource", "?") + (
                    f"/{ref['subresource']}" if ref.get("subresource") else ""
                )
                kinds[f"{entry.get('verb')} {what}"] += 1
        return kinds


# ---------------------------------------------------------------------------- helpers


def collector_pauses(metrics_url: str) -> dict[str, Any]:
    """The operator's garbage-collector pauses since it started, from its /metrics."""
    seconds: dict[str, float] = {}
    counts: dict[str, int] = {}
    longest = 0.0
    for line in httpx.get(metrics_url, timeout=10).text.splitlines():
        value = line.rsplit(" ", 1)[-1]
        if line.startswith("corral_gc_pause_seconds_total{"):
            seconds[_label(line, "generation")] = float(value)
        elif line.startswith("corral_gc_collections_total{"):
            counts[_label(line, "generation")] = int(float(value))
        elif line.startswith("corral_gc_longest_pause_seconds "):
            longest = float(value)
    return {
        "operator_gc_pause_s": round(sum(seconds.values()), 2),
        "operator_gc_collections": sum(counts.values()),
        # generation: [collections, seconds]
        "operator_gc_by_generation": {
            gen: [counts.get(gen, 0), round(seconds[gen], 2)] for gen in sorted(seconds)
        },
        "operator_gc_longest_pause_ms": round(longest * 1000, 1),
    }


def wait(what: str, probe: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            print(f"bench: timed out after {timeout:.0f}s waiting for {what}", file=sys.stderr)
            return False
        time.sleep(0.1)
    return True


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, round(q / 100 * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


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
    stack.enforce_restricted(plane, name)
    controlplane.wait_for_default_service_account(plane, name)


def agent_doc(ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "coder", "namespace": ns},
        "spec": {"identity": "You code.", "model": "corral-scripted"},
    }


def session_docs(ns: str, prefix: str, n: int, repo: Path) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "corral.dev/v1alpha1",
            "kind": "Session",
            "metadata": {"name": f"{prefix}{i:04d}", "namespace": ns},
            "spec": {"agentRef": "coder", "task": "Say done.", "workspace": {"repo": str(repo)}},
        }
        for i in range(n)
    ]


# ------------------------------------------------------------------------------ a burst


@dataclass
class Burst:
    """One burst: apply `n` Sessions with kubectl, measure until all have finished."""

    plane: controlplane.ControlPlane
    api: Api
    audit: AuditCounter
    ns: str
    n: int
    timeout: float
    # Other processes whose CPU seconds the figures report (the stand-in sandbox).
    side_processes: dict[str, ProcessMeter] = field(default_factory=dict)
    metrics_url: str = ""  # the operator's /metrics

    def run(self, operator: subprocess.Popen[bytes], repo: Path, prefix: str) -> dict[str, Any]:
        clock, stop = Clock(), threading.Event()
        meter = ProcessMeter(operator.pid)
        self.api.start_watches(self.ns, clock, stop)
        sampling = threading.Thread(target=self._sample, args=(meter, stop), daemon=True)
        sampling.start()
        self.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(agent_doc(self.ns)))
        time.sleep(1.0)  # the Agent is validated once, before the clock starts
        manifest = WORK / f"{self.ns}-sessions.yaml"
        manifest.write_text(yaml.safe_dump_all(session_docs(self.ns, prefix, self.n, repo)))
        others = {name: ProcessMeter(proc.pid) for name, proc in self.plane.processes.items()}
        others.update(self.side_processes)
        for other in others.values():
            other.read()
        cpu_before = {name: other.cpu_s for name, other in others.items()}
        timeline: list[dict[str, float]] = []
        meters = {"operator": ProcessMeter(operator.pid), **others}
        threading.Thread(target=self._cores, args=(meters, timeline, stop), daemon=True).start()
        try:
            self.audit.start()
            waits_before = self.api.queue_waits()
            children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            own_before = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            self.plane.kubectl("apply", "-f", str(manifest), timeout=600)
            kubectl_s = time.perf_counter() - t0
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            kubectl_cpu = (children.ru_utime - children_before.ru_utime) + (
                children.ru_stime - children_before.ru_stime
            )
            all_in = wait(
                f"{self.n} sessions admitted", lambda: len(clock.admitted) >= self.n, self.timeout
            )
            admitted_at = time.perf_counter()
            done = all_in and wait(
                f"{self.n} sessions finished and their pods gone",
                lambda: len(clock.finished) >= self.n and len(clock.pods_gone) >= self.n,
                self.timeout,
            )
            meter.read()
            for other in others.values():
                other.read()
            own = resource.getrusage(resource.RUSAGE_SELF)
            watches_cpu = (own.ru_utime - own_before.ru_utime) + (
                own.ru_stime - own_before.ru_stime
            )
            requests = self.audit_count_settled()
            waits = self.api.queue_waits()
            pauses = collector_pauses(self.metrics_url)
        finally:
            stop.set()
        figures = self._figures(clock, meter, requests, t0, kubectl_s, admitted_at, done)
        # Mean wait in the API server's fair queues per priority level (the operator's
        # ServiceAccount is in workload-low; the admin who applies is exempt).
        figures["apiserver_queue_wait_ms_mean"] = {
            level: round((total - waits_before.get(level, (0.0, 0.0))[0])
                         / max(1.0, count - waits_before.get(level, (0.0, 0.0))[1]) * 1000, 1)
            for level, (total, count) in sorted(waits.items())
            if count > waits_before.get(level, (0.0, 0.0))[1]
        }  # fmt: skip
        # Where the machine's CPU went during the burst, and whose requests the server served.
        figures["cpu_s_during_burst"] = {
            name: round(other.cpu_s - cpu_before[name], 1) for name, other in others.items()
        } | {"kubectl": round(kubectl_cpu, 1), "bench-watches": round(watches_cpu, 1)}
        figures["cores_used_per_10s"] = timeline
        # The operator's garbage-collector pauses over the whole run (its event loop stops).
        figures.update(pauses)
        figures["api_requests_by_user"] = {
            user.rsplit(":", 1)[-1]: count for user, count in self.audit.by_user.most_common(6)
        }
        return figures

    def audit_count_settled(self) -> collections.Counter[str]:
        # The audit log is written when a request completes: give the last ones a moment.
        time.sleep(1.0)
        return self.audit.count()

    @staticmethod
    def _cores(
        meters: dict[str, ProcessMeter], timeline: list[dict[str, float]], stop: threading.Event
    ) -> None:
        """Cores each process used, per TIMELINE_SECONDS window, while the burst runs."""
        for meter in meters.values():
            meter.read()
        before = {name: meter.cpu_s for name, meter in meters.items()}
        while not stop.wait(TIMELINE_SECONDS):
            used = {}
            for name, meter in meters.items():
                meter.read()
                used[name] = round((meter.cpu_s - before[name]) / TIMELINE_SECONDS, 2)
                before[name] = meter.cpu_s
            timeline.append(used)

    @staticmethod
    def _sample(meter: ProcessMeter, stop: threading.Event) -> None:
        while not stop.is_set():
            meter.read()
            time.sleep(0.5)

    def _figures(
        self,
        clock: Clock,
        meter: ProcessMeter,
        requests: collections.Counter[str],
        t0: float,
        kubectl_s: float,
        admitted_at: float,
        done: bool,
    ) -> dict[str, Any]:
        with clock.lock:
            to_pod = [
                (clock.pod[s] - clock.applied[s]) * 1000 for s in clock.pod if s in clock.applied
            ]
            to_turn = [
                (clock.admitted[s] - clock.applied[s]) * 1000
                for s in clock.admitted
                if s in clock.applied
            ]
            phases = collections.Counter(clock.phases.values())
            times = os.environ.get("CORRAL_BENCH_TIMES")
            if times:  # a line a Session: when applied (s after kubectl began), to pod, to turn
                Path(times).write_text("".join(
                    f"{clock.applied[s] - t0:.3f} {(clock.pod.get(s, 0) - clock.applied[s]):.3f} "
                    f"{(clock.admitted.get(s, 0) - clock.applied[s]):.3f} {s}\n"
                    for s in sorted(clock.applied, key=clock.applied.__getitem__)
                ))  # fmt: skip
            last = max(clock.admitted.values(), default=admitted_at)
        total = sum(requests.values())
        return {
            "sessions": self.n,
            "kubectl_apply_s": round(kubectl_s, 2),
            "pods_seen": len(to_pod),
            "admitted": len(to_turn),
            "apply_to_pod_ms_p50": round(percentile(to_pod, 50), 1) if to_pod else None,
            "apply_to_pod_ms_p99": round(percentile(to_pod, 99), 1) if to_pod else None,
            "apply_to_first_turn_ms_p50": round(percentile(to_turn, 50), 1) if to_turn else None,
            "apply_to_first_turn_ms_p99": round(percentile(to_turn, 99), 1) if to_turn else None,
            "all_admitted_s": round(last - t0, 2) if len(to_turn) >= self.n else None,
            "all_finished": done,
            "phases": dict(phases),
            "operator_peak_rss_mb": round(meter.peak_rss_mb, 1),
            "operator_cpu_s": round(meter.cpu_s, 1),
            "api_requests_per_session": round(total / self.n, 1),
            "api_requests_top": dict(requests.most_common(16)),
        }


# ------------------------------------------------------------------------------- parts


def part_standin(
    plane: controlplane.ControlPlane,
    api: Api,
    audit: AuditCounter,
    model_url: str,
    n: int,
    turn_seconds: float,
) -> dict[str, Any]:
    ns = "bench-burst"
    new_namespace(plane, ns)
    # The stand-in stands in for the kubelets of other machines: at nice 10, its CPU comes
    # second to the control plane's and the operator's, as it would on machines of its own.
    standin = subprocess.Popen(
        [
            "nice",
            "-n",
            str(STANDIN_NICENESS),
            sys.executable,
            "-m",
            "corral_dev._standin_sandbox",
            "--kubeconfig",
            str(plane.kubeconfig),
            "--namespace",
            ns,
            "--turn-seconds",
            str(turn_seconds),
        ],
        stdout=subprocess.PIPE,
        stderr=(WORK / "standin.log").open("wb"),
    )
    assert standin.stdout is not None
    if standin.stdout.readline().strip() != b"ready":
        raise SystemExit("bench: the stand-in sandbox did not start; see standin.log")
    metrics_port = controlplane.free_port()
    operator = start_operator(plane, ns, model_url, WORK / "operator-burst.log", metrics_port)
    try:
        burst = Burst(plane, api, audit, ns, n, timeout=max(180.0, n * 0.6))
        burst.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        burst.side_processes["standin-sandbox"] = ProcessMeter(standin.pid)
        return burst.run(operator, WORK / "repo", "b")
    finally:
        operator.terminate()
        operator.wait(timeout=60)
        standin.terminate()
        standin.wait(timeout=30)
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def part_local_node(
    plane: controlplane.ControlPlane, api: Api, audit: AuditCounter, model_url: str, n: int
) -> dict[str, Any]:
    ns = "bench-node"
    new_namespace(plane, ns)
    node_dir = WORK / "node"
    shutil.rmtree(node_dir, ignore_errors=True)
    repo = WORK / "repo"
    # The node hides root's home from its containers; the repository is shared read-only.
    node = stack.start_local_node(
        plane.kubeconfig, node_dir, "bench-node", WORK / "node.log", shares=(repo,)
    )
    metrics_port = controlplane.free_port()
    operator = start_operator(plane, ns, model_url, WORK / "operator-node.log", metrics_port)
    try:
        burst = Burst(plane, api, audit, ns, n, timeout=900.0)
        burst.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        return burst.run(operator, repo, "n")
    finally:
        operator.terminate()
        node.terminate()
        operator.wait(timeout=60)
        node.wait(timeout=60)


def verdicts(burst: dict[str, Any]) -> list[tuple[str, bool]]:
    admitted = burst.get("all_admitted_s")
    p99 = burst.get("apply_to_pod_ms_p99")
    return [
        (
            f"all {burst['sessions']} admitted within {TARGET_ALL_ADMITTED_S:.0f} s: {admitted} s",
            admitted is not None and admitted <= TARGET_ALL_ADMITTED_S,
        ),
        (
            f"operator peak RSS under {TARGET_RSS_MB:.0f} MB: {burst['operator_peak_rss_mb']} MB",
            burst["operator_peak_rss_mb"] < TARGET_RSS_MB,
        ),
        (
            f"p99 apply -> pod under {TARGET_P99_POD_MS:.0f} ms: {p99} ms",
            p99 is not None and p99 < TARGET_P99_POD_MS,
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--burst", type=int, default=1000, help="Sessions on the stand-in (0: skip)"
    )
    parser.add_argument(
        "--local-node", type=int, default=50, help="Sessions on real local pods (0: skip)"
    )
    parser.add_argument("--turn-seconds", type=float, default=0.5, help="a stand-in turn's length")
    parser.add_argument(
        "--lenient", action="store_true", help="exit 0 even when a target is missed"
    )
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="cp-", dir=WORK))
    audit = AuditCounter(state / "audit.log")
    plane = controlplane.start(state, audit_log=audit.path)
    model = None
    missed = False
    try:
        controlplane.install_crds(plane)
        make_repo()
        script = WORK / "script.yaml"
        script.write_text(yaml.safe_dump({"default": [{"text": "Done."}]}))
        port = controlplane.free_port()
        model = stack.start_scripted_model(port, script)
        model_url = f"http://127.0.0.1:{port}"
        stack.wait_serving("the scripted model", f"{model_url}/_requests", model)
        api = Api(plane.kubeconfig)
        if args.burst:
            burst = part_standin(plane, api, audit, model_url, args.burst, args.turn_seconds)
            print(
                f"== A: {args.burst} Sessions, real operator, STAND-IN SANDBOX (one process "
                "answers every pod's wire and usage endpoint)"
            )
            print(json.dumps(burst, indent=2), flush=True)
            for text, ok in verdicts(burst):
                print(f"  {'PASS' if ok else 'MISS'}  {text}")
                missed = missed or not ok
        if args.local_node:
            node = part_local_node(plane, api, audit, model_url, args.local_node)
            print(f"== B: {args.local_node} Sessions at once, real operator, real local-node pods")
            print(json.dumps(node, indent=2), flush=True)
        return 1 if (missed and not args.lenient) else 0
    finally:
        if model is not None:
            model.terminate()
        plane.stop()
        # etcd's data and the audit log are some 250 MB a run; kept only when asked for.
        if os.environ.get("CORRAL_BENCH_KEEP_STATE"):
            print(f"bench: the control plane's state (audit log included) is in {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
