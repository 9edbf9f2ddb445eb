"""Harness benchmark: per-step overhead, in-process and through the exec service; cold start.

Per step: the scripted model answers instantly with one `bash: echo` call per answer; the
harness runs it through the real SDK over loopback with durable (fdatasync'ed) writes, and a
client follows the wire by long-poll. The overhead of a step is the interval between two
consecutive model requests as the scripted model server records them (the model's own
answer, the tool, the policy and its instruction-file rescan, the records), median over 20
steps a turn. It is measured twice on the SAME realistic tree (20,000 files, 200 AGENTS.md):
with the harness running the tools itself, and with CORRAL_EXEC_SOCKET pointing at a real
`corral-exec` (the pod's tools container), turns of the two alternating so load on the
machine falls on both alike. Cold start: process spawn to the first 200 from /readyz.

With `--baseline REV` a third harness runs the code of git revision REV (its packages from
`git archive`, on the same interpreter), so the figure from before a change is taken in the same
run, on the same tree, alternating with the others; the ratio target is then exec / baseline.

Targets on a 2-core machine: exec <= 1.10 x in-process (or x the baseline), 1.5 s cold start.

    python bench/harness_bench.py [--steps 20] [--runs 4] [--starts 5] [--baseline REV]
"""

from __future__ import annotations

import argparse
import itertools
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from context_bench import AGENTS_FILES, TOTAL_FILES, build_tree

from corral_dev.execbin import exec_binary
from corral_dev.ports import free_port

BIN = Path(sys.executable).parent
AGENT = {"identity": "bench", "model": "corral-scripted", "tools": {"allow": ["bash"]}}
RATIO_TARGET = 1.10
COLD_START_TARGET = 1.5


def wait_ready(url: str, proc: subprocess.Popen[bytes], limit: float = 30, **kw: Any) -> float:
    started = time.perf_counter()
    with httpx.Client(**kw) as client:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"process exited with {proc.returncode}")
            try:
                if client.get(f"{url}/readyz", timeout=1).status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            if time.perf_counter() - started > limit:
                raise SystemExit(f"{url} not ready after {limit} s")
            time.sleep(0.005)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "ANTHROPIC_"))}


def start_exec(
    work: Path, root: Path, binary: Path | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """A corral-exec serving root, as the tools container runs it (this tree's, or `binary`)."""
    socket = work / f"exec-{free_port()}" / "exec.sock"
    env = _clean_env()
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"  # rg, as the tools image would have it
    proc = subprocess.Popen(
        [str(binary or exec_binary()), "serve", "--socket", str(socket), "--root", str(root)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    transport = httpx.HTTPTransport(uds=str(socket))
    deadline = time.monotonic() + 20
    with httpx.Client(transport=transport, base_url="http://exec") as client:
        while True:
            try:
                if client.get("/healthz").status_code == 200:
                    return proc, socket
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("corral-exec did not start")
            time.sleep(0.01)


def checkout_baseline(work: Path, rev: str) -> Path:
    """The packages of git revision `rev`, unpacked under work (no worktree left behind)."""
    repo = Path(__file__).resolve().parents[1]
    target = work / f"baseline-{rev}"
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", rev, "api", "harness_image"],
        check=True,
        capture_output=True,
    )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def start_harness(
    work: Path,
    model_url: str,
    root: Path,
    *,
    durable: bool = True,
    exec_socket: Path | None = None,
    baseline: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str, float]:
    port = free_port()
    env = _clean_env()
    env.update(
        CORRAL_HARNESS_ADDR=f"127.0.0.1:{port}",
        CORRAL_STATE_DIR=str(work / f"state-{port}"),
        CORRAL_GRANTED_ROOT=str(root),
        ANTHROPIC_BASE_URL=model_url,
        CORRAL_DURABLE="1" if durable else "0",
        **(extra_env or {}),
    )
    if exec_socket is not None:
        env["CORRAL_EXEC_SOCKET"] = str(exec_socket)
    argv = [str(BIN / "corral-harness")]
    if baseline is not None:
        # The old packages first on the path: they shadow the installed (editable) ones.
        env["PYTHONPATH"] = f"{baseline / 'api'}:{baseline / 'harness_image'}"
        argv = [sys.executable, "-m", "corral_harness.main"]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return proc, url, time.perf_counter() - started


def run_turn(client: httpx.Client, url: str, conv: str) -> float:
    started = time.perf_counter()
    admitted = client.post(f"{url}/agents/bench/{conv}", json={"message": "go", "agent": AGENT})
    admitted.raise_for_status()
    sid, offset = admitted.json()["submissionId"], admitted.json()["offset"]
    while True:
        body = client.get(
            f"{url}/agents/bench/{conv}/updates", params={"offset": offset, "wait": 30}
        ).json()
        offset = body["offset"]
        done = [e for e in body["events"] if e["type"] == "settled" and e["submissionId"] == sid]
        if done:
            if done[0]["status"] != "completed":
                raise SystemExit(f"turn did not complete: {done[0]}")
            return time.perf_counter() - started


def step_intervals(client: httpx.Client, model_url: str, conv: str) -> list[float]:
    """Seconds between consecutive model requests of one conversation, at the model server."""
    requests = client.get(f"{model_url}/_requests", params={"conversation": conv}).json()
    stamps = sorted(r["ts"] for r in requests)
    return [b - a for a, b in itertools.pairwise(stamps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--no-durable", action="store_true", help="no fdatasync (comparison)")
    parser.add_argument(
        "--baseline", metavar="REV", help="also run the harness of this git revision, in-process"
    )
    args = parser.parse_args()
    kinds = ["local", "exec"] + (["before"] if args.baseline else [])
    exec_binary()  # build (or find) corral-exec before anything is timed

    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        work = Path(tmp)
        tree = work / "tree"
        build_tree(tree)
        empty = work / "empty"
        empty.mkdir()
        script = work / "script.json"
        replies = [
            {"tool_use": {"name": "bash", "input": {"command": "echo step"}}, "repeat": args.steps},
            {"text": "done"},
        ]
        convs = {f"{kind}-{i}": replies for kind in kinds for i in range(args.runs + 1)}
        script.write_text(json.dumps({"conversations": convs}))
        model_port = free_port()
        model = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "corral_dev.scripted",
                "--port",
                str(model_port),
                "--script",
                str(script),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        model_url = f"http://127.0.0.1:{model_port}"
        procs: list[subprocess.Popen[bytes]] = [model]
        steps: dict[str, list[float]] = {kind: [] for kind in kinds}
        try:
            wait_ready(model_url, model)
            starts = []
            for _ in range(args.starts):
                proc, _url, seconds = start_harness(work, model_url, empty)
                starts.append(seconds)
                proc.terminate()
                proc.wait(10)
            service, socket = start_exec(work, tree)
            procs.append(service)
            local, local_url, _ = start_harness(work, model_url, tree, durable=not args.no_durable)
            procs.append(local)
            remote, exec_url, _ = start_harness(
                work, model_url, tree, durable=not args.no_durable, exec_socket=socket
            )
            procs.append(remote)
            urls = {"local": local_url, "exec": exec_url}
            if args.baseline:
                before, urls["before"], _ = start_harness(
                    work,
                    model_url,
                    tree,
                    durable=not args.no_durable,
                    baseline=checkout_baseline(work, args.baseline),
                )
                procs.append(before)
            with httpx.Client(timeout=120) as client:
                for kind, url in urls.items():
                    run_turn(client, url, f"{kind}-0")  # warm-up: SDK import, first connection
                for i in range(1, args.runs + 1):
                    order = kinds if i % 2 else list(reversed(kinds))
                    for kind in order:
                        run_turn(client, urls[kind], f"{kind}-{i}")
                        steps[kind] += step_intervals(client, model_url, f"{kind}-{i}")
        finally:
            for p in reversed(procs):
                p.terminate()
                p.wait(10)

    load = os.getloadavg()[0]
    local_ms = statistics.median(steps["local"]) * 1000
    exec_ms = statistics.median(steps["exec"]) * 1000
    ratio = exec_ms / local_ms
    if args.baseline:
        ratio = exec_ms / (statistics.median(steps["before"]) * 1000)
    cold = statistics.median(starts)
    print(
        f"tree: {TOTAL_FILES} files, {AGENTS_FILES} AGENTS.md; "
        f"{args.steps} `bash echo` steps a turn, {args.runs} turns each, alternating"
    )
    labels = {"local": "in-process", "exec": "exec service", "before": f"at {args.baseline}"}
    for kind in kinds:
        label, samples = labels[kind], steps[kind]
        p90 = statistics.quantiles(samples, n=10)[-1] * 1000
        print(
            f"per-step overhead, {label:>12}: median {statistics.median(samples) * 1000:7.2f} ms "
            f"over {len(samples)} steps (p90 {p90:.2f} ms)"
        )
    print(f"exec / in-process: {exec_ms / local_ms:.3f}")
    if args.baseline:
        print(f"exec / {args.baseline} (before the change): {ratio:.3f}")
    print(f"ratio against the target: {ratio:.3f} (target <= {RATIO_TARGET:.2f})")
    print(
        f"cold start to /readyz: median {cold:.3f} s over {len(starts)} starts "
        f"(min {min(starts):.3f}, max {max(starts):.3f}; target <= {COLD_START_TARGET} s)"
    )
    print(f"load average (1 min) at the end: {load:.2f} on {os.cpu_count()} cores")
    if ratio > RATIO_TARGET or cold > COLD_START_TARGET:
        print("TARGET MISSED")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
