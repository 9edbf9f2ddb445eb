"""Prompt caching on the demo task: input tokens billed per step, with and without breakpoints.

The demo task (examples/session.yaml's task, examples/agent.yaml's Agent, a fresh copy of
examples/demo/repo) runs as one multi-step turn against the scripted model playing
examples/demo/scenario.yaml, which bills the prompt cache as the provider does (a request is
billed a cache read for the longest marked prefix an earlier request wrote, a cache write for
what it marks past that; corral_dev.scripted._cache). A real `corral-harness` runs the turn
twice per run, once as it runs by default (every request marks its stable prefixes: the tool
list, the identity, the instruction files, the conversation so far) and once with
CORRAL_CACHE_BREAKPOINTS=0, the two alternating, the model's cache emptied before each turn (a
new Session, nothing written in the last five minutes).

A step's billed input is in input-token equivalents at the provider's cache prices: input +
1.25 x cache write + 0.1 x cache read. Printed: each step of the last run of each way, the
turn's totals (the same every run: the scripted model is deterministic), and with / without.
Target: with breakpoints the turn is billed less than without (ratio < 1).

    python bench/cache_bench.py [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness_bench import start_harness, wait_ready

from corral_dev.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "examples"
WRITE_PRICE, READ_PRICE = 1.25, 0.1  # of the input price: a 5-minute cache write, a read
RATIO_TARGET = 1.0
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
WAYS = {"with": "1", "without": "0"}  # CORRAL_CACHE_BREAKPOINTS


def demo_task() -> tuple[dict[str, Any], str]:
    """The demo's Agent spec and task, from the examples `make demo` runs."""
    agent = yaml.safe_load((EXAMPLES / "agent.yaml").read_text())["spec"]
    session = yaml.safe_load((EXAMPLES / "session.yaml").read_text())["spec"]
    return agent, str(session["task"])


def demo_workspace(work: Path, name: str) -> Path:
    """A fresh git copy of the demo repository on the Session's branch, as the checkout leaves
    it."""
    root = work / name
    shutil.copytree(EXAMPLES / "demo" / "repo", root)
    for argv in (["init", "-q", "-b", "corral/fix-discount"], ["add", "-A"],
                 ["commit", "-q", "-m", "the demo repository"]):  # fmt: skip
        subprocess.run([*GIT, *argv], cwd=root, check=True, capture_output=True)
    return root


def billed(usage: dict[str, int]) -> float:
    """A request's input in input-token equivalents at the cache's prices."""
    return (
        usage["input_tokens"]
        + WRITE_PRICE * usage["cache_creation_input_tokens"]
        + READ_PRICE * usage["cache_read_input_tokens"]
    )


def run_turn(
    client: httpx.Client, url: str, model_url: str, conv: str, agent: dict[str, Any], task: str
) -> list[dict[str, int]]:
    """Admit the demo task, follow it to its settlement, and return each request's usage."""
    client.delete(f"{model_url}/_cache").raise_for_status()
    admitted = client.post(f"{url}/agents/fixer/{conv}", json={"message": task, "agent": agent})
    admitted.raise_for_status()
    sid, offset = admitted.json()["submissionId"], admitted.json()["offset"]
    while True:
        body = client.get(
            f"{url}/agents/fixer/{conv}/updates", params={"offset": offset, "wait": 30}
        ).json()
        offset = body["offset"]
        done = [e for e in body["events"] if e["type"] == "settled" and e["submissionId"] == sid]
        if done:
            break
    settled = done[0]
    if settled["status"] != "completed":
        raise SystemExit(f"the demo turn did not complete: {settled}")
    requests = client.get(f"{model_url}/_requests", params={"conversation": conv}).json()
    usages = [r["usage"] for r in requests]
    # The settlement and its receipt carry the same reads and writes the model billed.
    for field, key in (("cacheRead", "cache_read_input_tokens"),
                       ("cacheWrite", "cache_creation_input_tokens")):  # fmt: skip
        if settled["usage"][field] != sum(u[key] for u in usages):
            raise SystemExit(f"settlement {field} {settled['usage'][field]} is not the model's")
    if settled["receipt"]["usage"] != settled["usage"]:
        raise SystemExit("the receipt's usage is not the settlement's")
    return usages


def print_steps(way: str, usages: list[dict[str, int]]) -> None:
    print(f"{way} breakpoints: input tokens billed per step (input + 1.25 x write + 0.1 x read)")
    for step, usage in enumerate(usages, 1):
        print(
            f"  step {step}: input {usage['input_tokens']:6d}  "
            f"cache write {usage['cache_creation_input_tokens']:6d}  "
            f"cache read {usage['cache_read_input_tokens']:6d}  billed {billed(usage):9.1f}"
        )
    print(f"  turn: {len(usages)} requests, billed {sum(billed(u) for u in usages):.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    agent, task = demo_task()
    turns: dict[str, list[list[dict[str, int]]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="corral-cache-bench-") as tmp:
        work = Path(tmp)
        model_port = free_port()
        model = subprocess.Popen(
            [sys.executable, "-m", "corral_dev.scripted", "--port", str(model_port),
             "--script", str(EXAMPLES / "demo" / "scenario.yaml")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        model_url = f"http://127.0.0.1:{model_port}"
        procs: list[subprocess.Popen[bytes]] = [model]
        try:
            wait_ready(model_url, model)
            with httpx.Client(timeout=120) as client:
                for run in range(args.runs):
                    order = list(WAYS) if run % 2 == 0 else list(reversed(WAYS))
                    for way in order:
                        root = demo_workspace(work, f"{way}-{run}")
                        proc, url, _ = start_harness(
                            work, model_url, root,
                            extra_env={"CORRAL_CACHE_BREAKPOINTS": WAYS[way]},
                        )  # fmt: skip
                        procs.append(proc)
                        turns[way].append(
                            run_turn(client, url, model_url, f"{way}-{run}", agent, task)
                        )
                        proc.terminate()
                        proc.wait(10)
        finally:
            for p in reversed(procs):
                p.terminate()
                p.wait(10)

    totals = {way: [sum(billed(u) for u in usages) for usages in turns[way]] for way in WAYS}
    for way in WAYS:
        print_steps(way, turns[way][-1])
    ratio = max(totals["with"]) / min(totals["without"])
    print(json.dumps({"billedInput": totals}))
    print(
        f"billed input with / without breakpoints: {ratio:.3f} "
        f"(worst run of each; target < {RATIO_TARGET:.1f})"
    )
    if ratio >= RATIO_TARGET or len(turns["with"][-1]) < 2:
        print("TARGET MISSED")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
