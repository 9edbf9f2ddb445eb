"""The working tools against escape attempts, and their limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral_harness.paths import GrantedRoot
from corral_harness.tools import SPECS, WorkingTools, run_command

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n")
    (root / "inside.txt").write_text("line one\nline two\nline three\n")
    os.symlink(outside, root / "link-out")
    os.symlink(outside / "secret.txt", root / "secret-link")
    return root, outside


@pytest.fixture
def tools(layout: tuple[Path, Path]) -> WorkingTools:
    return WorkingTools(GrantedRoot(layout[0]), bash_timeout=5, output_cap=2000)


ESCAPES = [
    "../outside/secret.txt",
    "link-out/secret.txt",
    "secret-link",
    "{outside}/secret.txt",
    "sub/../../outside/secret.txt",
]


@pytest.mark.parametrize("path", ESCAPES)
async def test_read_refuses_every_way_out_of_the_root(
    tools: WorkingTools, layout: tuple[Path, Path], path: str
) -> None:
    result = await tools.run("read", {"path": path.format(outside=layout[1])})
    assert result.is_error
    assert "outside the granted root" in result.content
    assert "TOP SECRET" not in result.content


@pytest.mark.parametrize("path", ESCAPES)
async def test_write_and_edit_refuse_every_way_out(
    tools: WorkingTools, layout: tuple[Path, Path], path: str
) -> None:
    target = path.format(outside=layout[1])
    written = await tools.run("write", {"path": target, "content": "pwned"})
    edited = await tools.run("edit", {"path": target, "old_string": "TOP", "new_string": "pwned"})
    assert written.is_error and edited.is_error
    assert (layout[1] / "secret.txt").read_text() == "TOP SECRET\n"


async def test_write_through_a_dangling_link_is_refused(
    tools: WorkingTools, layout: tuple[Path, Path]
) -> None:
    os.symlink(layout[1] / "not-yet" / "dir", layout[0] / "dangling")
    result = await tools.run("write", {"path": "dangling/file.txt", "content": "x"})
    assert result.is_error
    assert not (layout[1] / "not-yet").exists()


async def test_read_write_edit_inside(tools: WorkingTools, layout: tuple[Path, Path]) -> None:
    root = layout[0]
    result = await tools.run("read", {"path": "inside.txt", "offset": 2, "limit": 1})
    assert result.content.startswith("     2\tline two")
    assert "[more lines follow; read again with offset=3]" in result.content
    assert not (await tools.run("write", {"path": "new/dir/f.txt", "content": "a a b"})).is_error
    assert (root / "new/dir/f.txt").read_text() == "a a b"
    ambiguous = await tools.run(
        "edit", {"path": "new/dir/f.txt", "old_string": "a", "new_string": "z"}
    )
    assert ambiguous.is_error and "occurs 2 times" in ambiguous.content
    replaced = await tools.run(
        "edit", {"path": "new/dir/f.txt", "old_string": "a", "new_string": "z", "replace_all": True}
    )
    assert not replaced.is_error and (root / "new/dir/f.txt").read_text() == "z z b"
    missing = await tools.run(
        "edit", {"path": "inside.txt", "old_string": "nope", "new_string": "x"}
    )
    assert missing.is_error and "not found" in missing.content


async def test_bash_runs_in_the_root_whatever_the_callers_cwd(
    tools: WorkingTools, layout: tuple[Path, Path]
) -> None:
    result = await tools.run("bash", {"command": "pwd; cat inside.txt | wc -l"})
    assert result.content.split() == [str(layout[0].resolve()), "3"]
    failed = await tools.run("bash", {"command": "echo oops >&2; exit 4"})
    assert failed.is_error and "oops" in failed.content and "[exit code 4]" in failed.content


async def test_bash_times_out_and_kills_the_process_group(
    tools: WorkingTools, layout: tuple[Path, Path]
) -> None:
    result = await tools.run(
        "bash", {"command": "(sleep 3; touch late.txt) & sleep 30", "timeout": 1}
    )
    assert result.is_error and "timed out after 1 s" in result.content
    import asyncio

    await asyncio.sleep(3.2)
    assert not (layout[0] / "late.txt").exists()  # the background child died with its group


async def test_bash_output_is_capped_with_a_marker(tools: WorkingTools) -> None:
    result = await tools.run("bash", {"command": "seq 1 100000"})
    assert len(result.content) < 2200
    assert "[output truncated:" in result.content
    assert result.content.startswith("1\n2\n") and result.content.rstrip().endswith("100000")


async def test_grep_and_glob_stay_inside(tools: WorkingTools, layout: tuple[Path, Path]) -> None:
    (layout[1] / "also.txt").write_text("line secret\n")
    found = await tools.run("grep", {"pattern": "line"})
    assert "inside.txt:1:line one" in found.content
    assert "secret" not in found.content.lower()
    assert (await tools.run("grep", {"pattern": "x", "path": "../outside"})).is_error
    assert (await tools.run("grep", {"pattern": "zzz-none"})).content == "no matches"
    listed = await tools.run("glob", {"pattern": "**/*.txt"})
    assert listed.content.splitlines() == ["inside.txt"]
    assert (await tools.run("glob", {"pattern": "../outside/*"})).is_error


async def test_read_only_refuses_writes_and_commands(layout: tuple[Path, Path]) -> None:
    tools = WorkingTools(GrantedRoot(layout[0]), read_only=True)
    for name, args in (
        ("bash", {"command": "touch x"}),
        ("write", {"path": "x", "content": ""}),
        ("edit", {"path": "inside.txt", "old_string": "line", "new_string": "l"}),
    ):
        result = await tools.run(name, args)
        assert result.is_error and "read-only" in result.content
    assert not (layout[0] / "x").exists()
    assert not (await tools.run("read", {"path": "inside.txt"})).is_error


def test_every_tool_has_a_schema_and_a_one_line_description() -> None:
    assert [s.name for s in SPECS] == ["read", "write", "edit", "bash", "grep", "glob"]
    for spec in SPECS:
        assert spec.description and "\n" not in spec.description
        assert spec.input_schema["type"] == "object" and spec.input_schema["required"]


async def test_a_flood_of_output_is_held_to_its_head_and_tail(tmp_path: Path) -> None:
    outcome = await run_command(
        ["/bin/sh", "-c", "printf start; head -c 3000000 /dev/zero | tr '\\0' x; printf end"],
        str(tmp_path),
        20,
        keep_bytes=1000,
    )
    assert outcome.exit_code == 0 and not outcome.timed_out
    assert outcome.output.startswith("start") and outcome.output.endswith("end")
    assert f"[output truncated: {3000008 - 1000} bytes cut]" in outcome.output
    assert len(outcome.output) < 1100
