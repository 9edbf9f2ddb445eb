"""Harness benchmark: per-step overhead and cold start to /readyz.

Per step: the scripted model answers instantly with one `bash: echo` call per answer; the
harness runs it through the real SDK over loopback with durable (fdatasync'ed) writes, and a
client follows the wire by long-poll. A step is the time between two step_boundary events
(model request + stream + tool + records). Cold start: process spawn to the first 200 from
/readyz. Targets on a 2-core machine: 10 ms per step, 1.5 s cold start.

    python bench/harness_bench.py [--steps 30] [--runs 3] [--starts 5]
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

from corral_harness.scripted import free_port

BIN = Path(sys.executable).parent
AGENT = {"identity": "bench", "model": "corral-scripted", "tools": {"allow": ["bash"]}}


def wait_ready(url: str, proc: subprocess.Popen[bytes], limit: float = 30) -> float:
    started = time.perf_counter()
    with httpx.Client() as client:
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


def start_harness(
    work: Path, model_url: str, durable: bool = True
) -> tuple[subprocess.Popen[bytes], str, float]:
    port = free_port()
    (work / "root").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "ANTHROPIC_"))}
    env.update(
        CORRAL_HARNESS_ADDR=f"127.0.0.1:{port}",
        CORRAL_STATE_DIR=str(work / f"state-{port}"),
        CORRAL_GRANTED_ROOT=str(work / "root"),
        ANTHROPIC_BASE_URL=model_url,
        CORRAL_DURABLE="1" if durable else "0",
    )
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(BIN / "corral-harness")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return proc, url, time.perf_counter() - started


def run_turn(client: httpx.Client, url: str, conv: str) -> tuple[list[dict[str, Any]], float]:
    started = time.perf_counter()
    admitted = client.post(f"{url}/agents/bench/{conv}", json={"message": "go", "agent": AGENT})
    admitted.raise_for_status()
    sid, offset = admitted.json()["submissionId"], admitted.json()["offset"]
    events: list[dict[str, Any]] = []
    while True:
        body = client.get(
            f"{url}/agents/bench/{conv}/updates", params={"offset": offset, "wait": 30}
        ).json()
        events += body["events"]
        offset = body["offset"]
        done = [e for e in body["events"] if e["type"] == "settled" and e["submissionId"] == sid]
        if done:
            if done[0]["status"] != "completed":
                raise SystemExit(f"turn did not complete: {done[0]}")
            return events, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--no-durable", action="store_true", help="no fdatasync (comparison)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        work = Path(tmp)
        script = work / "script.json"
        replies = [
            {"tool_use": {"name": "bash", "input": {"command": "echo step"}}, "repeat": args.steps},
            {"text": "done"},
        ]
        convs = {f"run-{i}": replies for i in range(args.runs + 1)}
        script.write_text(json.dumps({"conversations": convs}))
        model_port = free_port()
        model = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "corral_harness.scripted",
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
        try:
            wait_ready(model_url, model)
            starts = []
            for _ in range(args.starts):
                proc, _url, seconds = start_harness(work, model_url)
                starts.append(seconds)
                proc.terminate()
                proc.wait(10)
            proc, url, _ = start_harness(work, model_url, durable=not args.no_durable)
            procs.append(proc)
            steps: list[float] = []
            per_turn: list[float] = []
            with httpx.Client(timeout=60) as client:
                run_turn(client, url, "run-0")  # warm-up: the SDK import and first connection
                for i in range(1, args.runs + 1):
                    events, seconds = run_turn(client, url, f"run-{i}")
                    marks = [e["ts"] for e in events if e["type"] == "step_boundary"]
                    steps += [b - a for a, b in itertools.pairwise(marks)]
                    per_turn.append(seconds / (len(marks) + 1))
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)

    load = os.getloadavg()[0]
    step_ms = statistics.median(steps) * 1000
    wire_ms = statistics.median(per_turn) * 1000
    cold = statistics.median(starts)
    print(
        f"per-step overhead: median {step_ms:.2f} ms over {len(steps)} steps "
        f"(p90 {statistics.quantiles(steps, n=10)[-1] * 1000:.2f} ms; target <= 10 ms)"
    )
    print(f"per-step, client wall time through the wire: median {wire_ms:.2f} ms per step")
    print(
        f"cold start to /readyz: median {cold:.3f} s over {len(starts)} starts "
        f"(min {min(starts):.3f}, max {max(starts):.3f}; target <= 1.5 s)"
    )
    print(f"load average (1 min) at the end: {load:.2f} on {os.cpu_count()} cores")
    if step_ms > 10 or cold > 1.5:
        print("TARGET MISSED")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
