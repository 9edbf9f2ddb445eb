"""AGENTS.md discovery: precedence, .git skipped, symlinks not followed, cache invalidation."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral_harness.context import (
    DEFAULT_BUDGETS,
    InstructionFileCache,
    LayerName,
    assemble,
    instruction_units,
    scan_instruction_files,
)
from corral_harness.context.instructions import AGENT_SOURCE, NamedFileIndex


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_precedence_root_then_shallow_then_deep_then_agent(tmp_path: Path) -> None:
    _write(tmp_path, "a/b/c/AGENTS.md", "deep")
    _write(tmp_path, "AGENTS.md", "root")
    _write(tmp_path, "z/AGENTS.md", "shallow z")
    _write(tmp_path, "a/AGENTS.md", "shallow a")
    files = scan_instruction_files(tmp_path)
    units = instruction_units(files, "agent says")
    assert [u.source for u in units] == [
        "AGENTS.md",
        "a/AGENTS.md",
        "z/AGENTS.md",
        "a/b/c/AGENTS.md",
        AGENT_SOURCE,
    ]


def test_git_directory_is_skipped_and_symlinks_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    _write(outside, "AGENTS.md", "secret from outside")
    root = tmp_path / "root"
    _write(root, ".git/AGENTS.md", "inside git")
    _write(root, "ok/AGENTS.md", "ok")
    os.symlink(outside, root / "linked")
    os.symlink(outside / "AGENTS.md", root / "ok" / "other")
    (root / "sub").mkdir()
    os.symlink(outside / "AGENTS.md", root / "sub" / "AGENTS.md")
    texts = [f.text for f in scan_instruction_files(root)]
    assert texts == ["ok"]


def test_trimming_drops_least_authoritative_first(tmp_path: Path) -> None:
    _write(tmp_path, "AGENTS.md", "r" * 200)
    _write(tmp_path, "pkg/AGENTS.md", "p" * 200)
    units = instruction_units(scan_instruction_files(tmp_path), "a" * 200)
    budgets = {**DEFAULT_BUDGETS, LayerName.INSTRUCTION_FILES: 120}
    report = assemble({LayerName.INSTRUCTION_FILES: units}, budgets).layer("instruction_files")
    assert report.kept == ["pkg/AGENTS.md", AGENT_SOURCE]
    assert report.dropped == ["AGENTS.md"]


def test_cache_serves_until_invalidated(tmp_path: Path) -> None:
    _write(tmp_path, "AGENTS.md", "v1")
    cache = InstructionFileCache()
    assert [f.text for f in cache.load(tmp_path)] == ["v1"]
    _write(tmp_path, "AGENTS.md", "v2")
    _write(tmp_path, "new/AGENTS.md", "new")
    assert [f.text for f in cache.load(tmp_path)] == ["v1"]  # cached
    assert cache.scans == 1
    assert cache.invalidate_path(tmp_path / "AGENTS.md") is True
    assert [f.text for f in cache.load(tmp_path)] == ["v2", "new"]
    assert cache.scans == 2


def test_a_change_to_an_ordinary_file_keeps_the_cache(tmp_path: Path) -> None:
    _write(tmp_path, "AGENTS.md", "v1")
    _write(tmp_path, "main.py", "print()")
    cache = InstructionFileCache()
    cache.load(tmp_path)
    assert cache.invalidate_path(tmp_path / "main.py") is False
    cache.invalidate()
    cache.load(tmp_path)
    assert cache.scans == 2


def test_missing_root_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError, match="not a directory"):
        scan_instruction_files(tmp_path / "nope")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    dirs=st.lists(
        st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=0, max_size=4).map(tuple),
        min_size=1,
        max_size=8,
        unique=True,
    )
)
def test_precedence_never_puts_a_deeper_file_before_a_shallower_one(
    tmp_path_factory: pytest.TempPathFactory, dirs: list[tuple[str, ...]]
) -> None:
    root = tmp_path_factory.mktemp("tree")
    for parts in dirs:
        _write(root, "/".join([*parts, "AGENTS.md"]), "/".join(parts) or "root")
    units = instruction_units(scan_instruction_files(root), "agent")
    depths = [u.source.count("/") for u in units[:-1]]
    assert depths == sorted(depths)
    assert len(units) == len(dirs) + 1
    assert units[-1].source == AGENT_SOURCE
    if () in dirs:
        assert units[0].source == "AGENTS.md"


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.dictionaries(
        st.sampled_from(["", "a", "b", "a/x", "b/y", "a/x/z"]), st.integers(1, 120), min_size=1
    ),
    budget=st.integers(0, 150),
)
def test_trimming_keeps_the_most_authoritative_files(
    tmp_path_factory: pytest.TempPathFactory, sizes: dict[str, int], budget: int
) -> None:
    root = tmp_path_factory.mktemp("tree")
    for rel, size in sizes.items():
        _write(root, f"{rel}/AGENTS.md" if rel else "AGENTS.md", "w" * size)
    units = instruction_units(scan_instruction_files(root), "agent " * 10)
    budgets = {**DEFAULT_BUDGETS, LayerName.INSTRUCTION_FILES: budget}
    report = assemble({LayerName.INSTRUCTION_FILES: units}, budgets).layer("instruction_files")
    order = [u.source for u in units]
    assert report.tokens <= budget
    # Whatever is dropped ranks below everything kept, except units too big to ever fit.
    if report.kept:
        weakest_kept = order.index(report.kept[0])
        for source in report.dropped:
            if order.index(source) > weakest_kept:
                unit = units[order.index(source)]
                assert (
                    assemble({LayerName.INSTRUCTION_FILES: [unit]}, budgets)
                    .layer("instruction_files")
                    .tokens
                    == 0
                )


def test_the_index_lists_only_directories_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for rel in ("a/AGENTS.md", "a/b/AGENTS.md", "c/x.py", "AGENTS.md"):
        _write(tmp_path, rel, rel)
    old = time.time() - 600
    for path in [tmp_path, *tmp_path.rglob("*")]:
        os.utime(path, (old, old))
    index = NamedFileIndex(tmp_path, "AGENTS.md")
    listed: list[str] = []
    real_list = NamedFileIndex._list

    def counting(self: NamedFileIndex, path: str, mtime: int, now: int) -> Any:
        listed.append(os.path.relpath(path, tmp_path))
        return real_list(self, path, mtime, now)

    monkeypatch.setattr(NamedFileIndex, "_list", counting)
    assert sorted(f.path for f in index.find({}, 1 << 20)) == [
        "AGENTS.md",
        "a/AGENTS.md",
        "a/b/AGENTS.md",
    ]
    assert sorted(listed) == [".", "a", "a/b", "c"]
    listed.clear()
    _write(tmp_path, "c/AGENTS.md", "new")  # c's mtime moves; nothing else does
    found = {f.path: f.content for f in index.find({}, 1 << 20)}
    assert listed == ["c"]
    assert found["c/AGENTS.md"] == "new"


def test_a_file_read_right_after_it_changed_gets_no_fingerprint(tmp_path: Path) -> None:
    import asyncio

    from corral_harness.tools import LocalWorkspace

    _write(tmp_path, "AGENTS.md", "same")
    cache = InstructionFileCache()
    workspace = LocalWorkspace(tmp_path)
    (fresh,) = asyncio.run(cache.refresh(workspace))
    assert fresh.size == -1  # racy: it will be read again
    _write(tmp_path, "AGENTS.md", "SAME")  # same size, maybe the same clock tick
    cache.invalidate(workspace.root)
    assert [f.text for f in asyncio.run(cache.refresh(workspace))] == ["SAME"]


def test_the_survey_generation_moves_only_when_the_answer_does(tmp_path: Path) -> None:
    from corral_harness.context.instructions import SurveyGenerations

    for rel in ("AGENTS.md", "a/AGENTS.md"):
        _write(tmp_path, rel, rel)
    old = time.time() - 600
    for path in [tmp_path, *tmp_path.rglob("*")]:
        os.utime(path, (old, old))
    index, generations = NamedFileIndex(tmp_path, "AGENTS.md"), SurveyGenerations()

    def observe(entries: list[tuple[str, str]], head: str | None = "ref: main") -> int:
        return generations.observe("AGENTS.md", index.scan(), entries, head)

    first = observe([("a", "dir")])
    assert observe([("a", "dir")]) == first
    assert observe([("a", "dir"), ("b", "file")]) == first + 1  # the root's entries
    assert observe([("a", "dir"), ("b", "file")], "ref: other") == first + 2  # the branch
    os.utime(tmp_path / "a" / "AGENTS.md", (old + 1, old + 1))  # same size, another mtime
    third = observe([("a", "dir"), ("b", "file")], "ref: other")
    assert third == first + 3
    _write(tmp_path, "a/AGENTS.md", "A/AGENTS.MD")  # now: racy, never claimed unchanged
    assert observe([("a", "dir"), ("b", "file")], "ref: other") == third + 1
    assert observe([("a", "dir"), ("b", "file")], "ref: other") == third + 2


def test_the_cache_stays_fresh_only_for_the_generation_it_was_read_at(tmp_path: Path) -> None:
    _write(tmp_path, "AGENTS.md", "rules")
    cache = InstructionFileCache()
    root = str(tmp_path)
    cache.command_ran(root, 3)  # nothing cached: nothing to keep or drop
    assert cache.generation(root) == 0
    cache.update(root, [], time.time_ns(), generation=3)
    cache.command_ran(root, 3)
    assert cache.fresh(root) is not None
    for unknown_or_other in (None, 0, 4):
        cache.command_ran(root, unknown_or_other)
        assert cache.fresh(root) is None
        cache.confirm(root, 3)
        assert cache.fresh(root) is not None
    cache.invalidate(root)
    cache.confirm(root, 2)  # another generation confirms nothing
    assert cache.fresh(root) is None and cache.confirmations == 3


def test_the_trimmed_instruction_layer_follows_every_change_of_its_units() -> None:
    from corral_harness.context.assembly import Unit, trim_layer
    from corral_harness.context.layers import Strategy
    from corral_harness.context.tokenizer import DEFAULT_TOKENIZER

    def trim(texts: list[str], budget: int = 1000) -> tuple[list[str], list[str]]:
        units = [Unit(f"d{i}/AGENTS.md", text) for i, text in enumerate(texts)]
        report, kept = trim_layer(
            LayerName.INSTRUCTION_FILES, units, budget, Strategy.DROP_WHOLE_UNITS, DEFAULT_TOKENIZER
        )
        assert report.kept == [u.source for u in kept]
        return [u.text for u in kept], report.dropped

    assert trim(["a" * 40, "b" * 40]) == (["a" * 40, "b" * 40], [])
    assert trim(["a" * 40, "b" * 40]) == (["a" * 40, "b" * 40], [])  # the same answer again
    assert trim(["a" * 40, "B" * 40]) == (["a" * 40, "B" * 40], [])  # one text changed
    assert trim(["a" * 40, "b" * 40], budget=15) == (["b" * 40], ["d0/AGENTS.md"])
