"""Per-step overhead on a real-sized repository, through the wire and the exec hop, beside pi.

The figure is the one every harness can be measured by from outside: the median interval
between consecutive model requests as the scripted model server records them, while the model
answers instantly with one `bash: echo step` call per answer (20 steps a turn). Corral runs
twice: as in a pod, a client following the turn over the wire (admit, long-poll) and the
harness running every tool and its AGENTS.md survey through a separate `corral-exec` process
over its Unix socket; and as `corral run` runs it, the same harness and client with the
in-process workspace (the harness runs the tools itself, its change signal from its own inotify
watch of the tree).

Two trees: a generated repository of 20,000 files with 200 AGENTS.md (cached under
~/.cache/corral/bench, built once) and an empty one. With `--peers DIR` (what
`hack/install-peers.sh` prints; `make bench-peers` passes it) pi runs the same 20 steps against
the same scripted model server on the same trees, its runs alternating with Corral's so load on
the machine falls on both alike; each figure is the median of the per-run medians (3 runs).

With `--baseline REV` the harness of git revision REV runs too, with that revision's
corral-exec and in-process (both from `git archive`), so the figures from before a change are
taken in the same run on the same tree.

Target: Corral / pi <= 0.5 on the 20,000-file tree, through the exec hop and in-process alike,
each ratio the median over the runs of that run's Corral median / pi median (checked only when
pi ran).

    python bench/steps_bench.py [--steps 20] [--runs 3] [--peers DIR] [--baseline REV]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from context_bench import AGENTS_FILES, TOTAL_FILES, build_tree
from harness_bench import (
    checkout_baseline,
    run_turn,
    start_exec,
    start_harness,
    step_intervals,
    wait_ready,
)

from corral_dev.execbin import exec_binary
from corral_dev.ports import free_port

RATIO_TARGET = 0.5
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "corral" / "bench"
PI_MODEL = "corral-scripted"
PI_CONVERSATION = ""  # pi sends no metadata.user_id: its requests fall in the unnamed one


def cached_tree() -> Path:
    """The 20,000-file tree, built once into the cache (atomically: a rename publishes it)."""
    tree = CACHE / f"tree-{TOTAL_FILES}-{AGENTS_FILES}"
    if not tree.is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix="tree-building-", dir=CACHE))
        build_tree(building)
        try:
            building.rename(tree)
        except OSError:  # another bench published it first
            shutil.rmtree(building)
    return tree


def replies(steps: int) -> list[dict[str, object]]:
    return [
        {"tool_use": {"name": "bash", "input": {"command": "echo step"}}, "repeat": steps},
        {"text": "done"},
    ]


def pi_cli(peers: Path) -> Path:
    cli = peers / "node_modules" / "@mariozechner" / "pi-coding-agent" / "dist" / "cli.js"
    if not cli.is_file():
        raise SystemExit(f"pi is not installed under {peers} (run hack/install-peers.sh)")
    return cli


class Pi:
    """pi as a user runs it (`pi -p`, sessions saved), its model the scripted server.

    pi takes a custom Anthropic-compatible endpoint as a provider in models.json (under
    PI_CODING_AGENT_DIR); PI_OFFLINE keeps its start free of network look-ups."""

    def __init__(self, peers: Path, work: Path, model_url: str) -> None:
        self.cli = pi_cli(peers)
        self.home = work / "pi-agent"
        self.home.mkdir()
        provider = {
            "baseUrl": model_url,
            "api": "anthropic-messages",
            "apiKey": "scripted",
            "models": [{"id": PI_MODEL, "reasoning": False}],
        }
        (self.home / "models.json").write_text(json.dumps({"providers": {"scripted": provider}}))
        self.sessions = work / "pi-sessions"

    def version(self) -> str:
        done = subprocess.run(
            ["node", str(self.cli), "--version"], capture_output=True, text=True, check=False
        )
        return (done.stdout or done.stderr).strip()

    def run(self, tree: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "PI_"))}
        env.update(PI_CODING_AGENT_DIR=str(self.home), PI_OFFLINE="1")
        argv = ["node", str(self.cli), "--provider", "scripted", "--model", PI_MODEL]
        argv += ["--tools", "bash", "--session-dir", str(self.sessions), "-p", "go"]
        done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or "done" not in done.stdout:
            raise SystemExit(f"pi failed ({done.returncode}): {done.stdout[-500:]}{done.stderr}")


def build_baseline_exec(checkout: Path) -> Path:
    """corral-exec of the baseline revision, built from its archive."""
    module = checkout / "harness_image" / "corral_exec"
    out = checkout / "corral-exec"
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    subprocess.run(
        ["go", "build", "-trimpath", "-o", str(out), "."], cwd=module, env=env, check=True
    )
    return out


def median_of_runs(runs: list[list[float]]) -> float:
    """Milliseconds: the median of each run's median."""
    return statistics.median(statistics.median(r) for r in runs) * 1000


def run_ratios(runs: list[list[float]], against: list[list[float]]) -> list[float]:
    """Each run's median over the median of the run of `against` made beside it (the runs
    alternate, so the two of a pair saw the same load)."""
    return [statistics.median(a) / statistics.median(b) for a, b in zip(runs, against, strict=True)]


def median_ratio(runs: list[list[float]], against: list[list[float]]) -> float:
    return statistics.median(run_ratios(runs, against))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--peers",
        type=Path,
        default=os.environ.get("CORRAL_BENCH_PEERS") or None,
        help="pi's install (hack/install-peers.sh prints it); without it Corral runs alone",
    )
    parser.add_argument("--baseline", metavar="REV", help="also run git revision REV")
    args = parser.parse_args()
    exec_binary()  # build (or find) corral-exec before anything is timed
    tree = cached_tree()

    with tempfile.TemporaryDirectory(prefix="corral-steps-") as tmp:
        work = Path(tmp)
        empty = work / "empty"
        empty.mkdir()
        trees = {"20k": tree, "empty": empty}
        kinds = ["corral", "run"]
        kinds += ["before", "before-run"] if args.baseline else []
        kinds += ["pi"] if args.peers else []
        convs = {
            f"{kind}-{name}-{i}": replies(args.steps)
            for kind in kinds
            for name in trees
            for i in range(args.runs + 1)
        }
        script = work / "script.json"
        script.write_text(json.dumps({"conversations": convs}))
        model_port = free_port()
        serve = [
            "-m",
            "corral_dev.scripted",
            "--port",
            str(model_port),
            "--script",
            str(script),
        ]
        model = subprocess.Popen(
            [sys.executable, *serve],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        model_url = f"http://127.0.0.1:{model_port}"
        procs: list[subprocess.Popen[bytes]] = [model]
        runs: dict[tuple[str, str], list[list[float]]] = {}
        pi = Pi(args.peers, work, model_url) if args.peers else None
        try:
            wait_ready(model_url, model)
            baseline = checkout_baseline(work, args.baseline) if args.baseline else None
            baseline_exec = build_baseline_exec(baseline) if baseline else None
            urls: dict[tuple[str, str], str] = {}
            for name, root in trees.items():
                service, socket = start_exec(work, root)
                procs.append(service)
                harness, urls[("corral", name)], _ = start_harness(
                    work, model_url, root, exec_socket=socket
                )
                procs.append(harness)
                # As `corral run` has it: no exec service, the harness's own workspace.
                harness, urls[("run", name)], _ = start_harness(work, model_url, root)
                procs.append(harness)
                if baseline is not None and baseline_exec is not None:
                    service, socket = start_exec(work, root, binary=baseline_exec)
                    procs.append(service)
                    harness, urls[("before", name)], _ = start_harness(
                        work, model_url, root, exec_socket=socket, baseline=baseline
                    )
                    procs.append(harness)
                    harness, urls[("before-run", name)], _ = start_harness(
                        work, model_url, root, baseline=baseline
                    )
                    procs.append(harness)

            with httpx.Client(timeout=300) as client:

                def corral_run(kind: str, name: str, i: int) -> Callable[[], list[float]]:
                    def go() -> list[float]:
                        conv = f"{kind}-{name}-{i}"
                        run_turn(client, urls[(kind, name)], conv)
                        return step_intervals(client, model_url, conv)

                    return go

                def pi_run(name: str) -> Callable[[], list[float]]:
                    def go() -> list[float]:
                        assert pi is not None
                        # The unnamed conversation starts its replies over; only this run's
                        # requests count.
                        reset = {"conversations": {PI_CONVERSATION: replies(args.steps)}}
                        client.post(f"{model_url}/_script", json=reset).raise_for_status()
                        since = time.time()
                        pi.run(trees[name])
                        seen = client.get(
                            f"{model_url}/_requests", params={"conversation": PI_CONVERSATION}
                        ).json()
                        stamps = sorted(r["ts"] for r in seen if r["ts"] >= since)
                        if len(stamps) != args.steps + 1:
                            raise SystemExit(f"pi made {len(stamps)} model requests")
                        return [b - a for a, b in itertools.pairwise(stamps)]

                    return go

                def one(kind: str, name: str, i: int) -> Callable[[], list[float]]:
                    return pi_run(name) if kind == "pi" else corral_run(kind, name, i)

                for name in trees:
                    for kind in kinds:  # warm-up: imports, first connections, page cache
                        one(kind, name, 0)()
                for i in range(1, args.runs + 1):
                    for name in trees:
                        for kind in kinds if i % 2 else list(reversed(kinds)):
                            runs.setdefault((kind, name), []).append(one(kind, name, i)())
        finally:
            for p in reversed(procs):
                p.terminate()
                p.wait(10)

    report(runs, kinds, args, pi.version() if pi else None)


def report(
    runs: dict[tuple[str, str], list[list[float]]],
    kinds: list[str],
    args: argparse.Namespace,
    pi_version: str | None,
) -> None:
    labels = {
        "corral": "Corral (exec hop)",
        "run": "Corral (corral run)",
        "before": f"exec hop at {args.baseline}",
        "before-run": f"corral run at {args.baseline}",
        "pi": "pi",
    }
    if pi_version:
        labels["pi"] = f"pi {pi_version}"
    print(
        f"{args.steps} `bash echo` steps a run, {args.runs} runs each, alternating; figure: "
        "median interval between model requests at the model server (median of run medians)"
    )
    figures: dict[tuple[str, str], float] = {}
    for name, title in (
        ("20k", f"{TOTAL_FILES} files, {AGENTS_FILES} AGENTS.md"),
        ("empty", "empty tree"),
    ):
        for kind in kinds:
            ms = figures[(kind, name)] = median_of_runs(runs[(kind, name)])
            each = ", ".join(f"{statistics.median(r) * 1000:.1f}" for r in runs[(kind, name)])
            print(f"per step, {title:>28}, {labels[kind]:>22}: {ms:7.2f} ms  (runs: {each})")
    missed = False
    for kind in kinds:  # what the tree itself costs a step: its instruction files, mostly
        cost = figures[(kind, "20k")] - figures[(kind, "empty")]
        print(f"the 20,000-file tree's own cost per step, {labels[kind]:>22}: {cost:+7.2f} ms")
    if "before" in kinds:
        for now, before in (("corral", "before"), ("run", "before-run")):
            for name in ("20k", "empty"):
                ratio = median_ratio(runs[(now, name)], runs[(before, name)])
                print(f"{labels[now]} now / at {args.baseline}, {name} tree: {ratio:.3f}")
    if "pi" in kinds:
        for kind in ("corral", "run"):
            for name in ("20k", "empty"):
                ratio = median_ratio(runs[(kind, name)], runs[("pi", name)])
                each = ", ".join(
                    f"{r:.2f}" for r in run_ratios(runs[(kind, name)], runs[("pi", name)])
                )
                print(f"{labels[kind]} / pi, {name} tree: {ratio:.3f}  (runs: {each})")
        for kind in ("corral", "run"):
            ratio = median_ratio(runs[(kind, "20k")], runs[("pi", "20k")])
            missed = missed or ratio > RATIO_TARGET
            print(
                f"ratio on the 20,000-file tree, {labels[kind]}: {ratio:.3f} "
                f"(target <= {RATIO_TARGET}; median over runs of the run's ratio)"
            )
    else:
        print("pi: not run (make bench-peers installs it; --peers DIR runs it)")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if missed:
        print("TARGET MISSED")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
