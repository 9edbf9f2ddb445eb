"""Instruction-file load times on a large tree: cold scan versus cache hit.

Builds 20,000 files with 200 AGENTS.md in a temporary directory, then prints the median of
several cold loads (a fresh cache each time; the OS page cache is warm after the first) and of
cached loads, one context assembly over the result, one full `prepare_request` of the turn
policy (cached instruction files), and one memory recall over 1,000 facts.

    .venv/bin/python bench/context_bench.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from corral_api.kinds import AgentSpec
from corral_harness.context import (
    DEFAULT_BUDGETS,
    InstructionFileCache,
    LayerName,
    assemble,
    instruction_units,
)
from corral_harness.memory import MemoryStore
from corral_harness.policy.turn_policy import CorralTurnPolicy
from corral_harness.ports import TurnContext

TOTAL_FILES = 20_000
AGENTS_FILES = 200


def build_tree(root: Path) -> None:
    # 20 top-level packages x 10 subpackages = 200 directories, one AGENTS.md each.
    per_dir = TOTAL_FILES // AGENTS_FILES - 1
    for top in range(20):
        for sub in range(10):
            d = root / f"pkg{top:02d}" / f"mod{sub:02d}"
            d.mkdir(parents=True)
            (d / "AGENTS.md").write_text(f"Rules for {d.name}: keep functions small.\n" * 5)
            for i in range(per_dir):
                (d / f"file{i:03d}.py").write_text("x = 1\n")
    (root / ".git").mkdir()
    for i in range(AGENTS_FILES - 1):
        (root / ".git" / f"obj{i}").write_text("skipped")


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def time_prepare(root: Path, runs: int) -> list[float]:
    agent = AgentSpec(identity="You are a careful engineer.", model="claude-sonnet-4-5")
    policy = CorralTurnPolicy(granted_root=root)
    ctx = TurnContext(
        conversation="bench",
        submission_id="s",
        agent=agent,
        model=agent.model,
        thinking_level="medium",
        granted_root=root,
        read_only=False,
        context_window=200_000,
        max_output_tokens=8_000,
    )
    transcript = [{"role": "user", "content": "Fix the failing test in pkg03."}]
    await policy.prepare_request(ctx, transcript)  # warm the instruction cache
    samples: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await policy.prepare_request(ctx, transcript)
        samples.append(time.perf_counter() - t0)
    return samples


def time_recall(db: Path, runs: int) -> list[float]:
    store = MemoryStore(db, scope="bench")
    for i in range(1000):
        store.add(f"module {i}", f"Module {i} owns the handler for feature {i % 37} and its tests.")
    store.link("module 3", "module 4")
    samples: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        store.recall("why does module 3 break feature 12 tests")
        samples.append(time.perf_counter() - t0)
    store.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_tree(root)
        count = sum(1 for p in root.rglob("*") if p.is_file() and ".git" not in p.parts)
        cold: list[float] = []
        for _ in range(args.runs):
            cache = InstructionFileCache()
            t0 = time.perf_counter()
            files = cache.load(root)
            cold.append(time.perf_counter() - t0)
        assert len(files) == AGENTS_FILES, len(files)
        cached: list[float] = []
        for _ in range(args.runs * 100):
            t0 = time.perf_counter()
            cache.load(root)
            cached.append(time.perf_counter() - t0)
        assembly: list[float] = []
        units = instruction_units(files, "Agent instructions.")
        for _ in range(args.runs):
            t0 = time.perf_counter()
            assemble({LayerName.INSTRUCTION_FILES: units}, DEFAULT_BUDGETS)
            assembly.append(time.perf_counter() - t0)
        prepare = asyncio.run(time_prepare(root, args.runs))
        recall = time_recall(root / "memory.db", args.runs)
        print(f"tree: {count} files, {len(files)} AGENTS.md")
        print(f"cold load   median {median_ms(cold):8.2f} ms  ({args.runs} runs)")
        print(f"cached load median {median_ms(cached) * 1000:8.2f} us  ({len(cached)} runs)")
        print(f"assembly    median {median_ms(assembly):8.2f} ms  ({args.runs} runs, 200 units)")
        print(f"prepare     median {median_ms(prepare):8.2f} ms  (turn policy, cached files)")
        print(f"recall      median {median_ms(recall):8.2f} ms  (1,000 facts)")


if __name__ == "__main__":
    main()
