"""The working tools behave the same in-process and through the real corral-exec service.

Every test here runs on both backends (`backend` is "local" or "exec"); the last one runs one
script of calls through each and compares the answers word for word.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import pytest

from corral_harness.context import InstructionFileCache
from corral_harness.paths import PathVerdict
from corral_harness.policy.turn_policy import CorralTurnPolicy
from corral_harness.ports import ToolCall, Workspace, WorkspaceError
from corral_harness.tools import LocalWorkspace, WorkingTools
from corral_harness.tools._exec_client import ExecWorkspace

from ..policy._helpers import WORKING, agent, ctx
from ._service import ExecService, wait_dead
from .conftest import SECRET_ENV, build_tree

pytestmark = pytest.mark.timeout(60)

ESCAPES = [
    "../outside/secret.txt",
    "link-out/secret.txt",
    "secret-link",
    "{outside}/secret.txt",
    "pkg/../../outside/secret.txt",
]


def _outside(tree: Path) -> Path:
    return tree.parent / "outside"


# ------------------------------------------------------------------------------ the root


@pytest.mark.parametrize("path", ESCAPES)
async def test_read_refuses_every_way_out_of_the_root(
    tools: WorkingTools, tree: Path, path: str
) -> None:
    target = path.format(outside=_outside(tree))
    result = await tools.run("read", {"path": target})
    assert result.is_error
    assert result.content == f"path {target!r} is outside the granted root {str(tree)!r}"


@pytest.mark.parametrize("path", ESCAPES)
async def test_write_and_edit_refuse_every_way_out(
    tools: WorkingTools, tree: Path, path: str
) -> None:
    target = path.format(outside=_outside(tree))
    written = await tools.run("write", {"path": target, "content": "pwned"})
    edited = await tools.run("edit", {"path": target, "old_string": "TOP", "new_string": "pwned"})
    assert written.is_error and "outside the granted root" in written.content
    assert edited.is_error and "outside the granted root" in edited.content
    assert (_outside(tree) / "secret.txt").read_text() == "TOP SECRET\n"


async def test_grep_glob_and_list_stay_inside(
    tools: WorkingTools, workspace: Workspace, tree: Path
) -> None:
    found = await tools.run("grep", {"pattern": "SECRET"})
    assert found.content == "no matches"
    assert (await tools.run("grep", {"pattern": "x", "path": "../outside"})).is_error
    assert (await tools.run("glob", {"pattern": "../outside/*"})).is_error
    listed = (await tools.run("glob", {"pattern": "**/*"})).content.splitlines()
    assert "link-out" not in listed and "secret-link" not in listed
    assert not any(line.startswith(".git") for line in listed)
    assert "link-in" in listed  # a link that stays inside is shown
    with pytest.raises(WorkspaceError) as refused:
        await workspace.list_dir("link-out")
    assert refused.value.kind == "outside"


async def test_a_dangling_symlink_is_uncertain(
    tools: WorkingTools, workspace: Workspace, tree: Path
) -> None:
    for path in ("dangling", "dangling/file.txt"):
        assert (await workspace.resolve(path)).verdict is PathVerdict.UNCERTAIN
        assert await workspace.classify(path) is PathVerdict.UNCERTAIN
    result = await tools.run("write", {"path": "dangling/file.txt", "content": "x"})
    assert result.is_error
    assert result.content == (
        f"path 'dangling/file.txt' cannot be resolved with certainty inside the granted root "
        f"{str(tree)!r}; refused"
    )
    assert not (tree / "not-yet").exists()


@pytest.mark.parametrize("path", ["bad\x00name", "bad\udcffname"])
async def test_nul_and_non_utf8_paths_are_uncertain(
    tools: WorkingTools, workspace: Workspace, path: str
) -> None:
    assert await workspace.classify(path) is PathVerdict.UNCERTAIN
    result = await tools.run("write", {"path": path, "content": "x"})
    assert result.is_error


async def test_resolve_names_the_real_path_and_its_kind(workspace: Workspace, tree: Path) -> None:
    cases = {
        "link-in": ("pkg", "dir"),
        "link-in/mod.py": ("pkg/mod.py", "file"),
        f"{tree}/inside.txt": ("inside.txt", "file"),
        "pkg/../nothing": ("nothing", "missing"),
        ".": (".", "dir"),
    }
    for path, (rel, kind) in cases.items():
        resolved = await workspace.resolve(path)
        assert (resolved.verdict, resolved.path, resolved.kind) == (PathVerdict.INSIDE, rel, kind)


# ------------------------------------------------------------------------------ commands


async def test_bash_runs_in_the_root(tools: WorkingTools, tree: Path) -> None:
    result = await tools.run("bash", {"command": "pwd; wc -l < inside.txt"})
    assert result.content.split() == [str(tree), "3"]
    failed = await tools.run("bash", {"command": "echo oops >&2; exit 4"})
    assert failed.is_error and failed.content == "oops\n\n[exit code 4]"


async def test_a_timeout_kills_the_whole_group(
    tools: WorkingTools, tree: Path, reap_pids: list[int]
) -> None:
    started = time.monotonic()
    result = await tools.run(
        "bash", {"command": "sleep 300 & echo $! > bg.pid; sleep 300", "timeout": 1}
    )
    assert time.monotonic() - started < 10
    assert result.is_error and "[command timed out after 1 s and was killed]" in result.content
    grandchild = int((tree / "bg.pid").read_text())
    reap_pids.append(grandchild)
    assert wait_dead(grandchild), "the backgrounded grandchild outlived the timeout"


async def test_cancelling_the_call_kills_the_whole_group(
    tools: WorkingTools, tree: Path, reap_pids: list[int]
) -> None:
    command = "sleep 300 & echo $! > bg.pid; echo $$ > sh.pid; wait"
    task = asyncio.create_task(tools.run("bash", {"command": command, "timeout": 60}))
    deadline = time.monotonic() + 10
    while not ((tree / "bg.pid").exists() and (tree / "sh.pid").exists()):
        assert time.monotonic() < deadline and not task.done(), "the command did not start"
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)  # both pid files written through
    pids = [int((tree / name).read_text()) for name in ("bg.pid", "sh.pid")]
    reap_pids.extend(pids)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()
    for pid in pids:
        assert wait_dead(pid), f"{pid} outlived the cancelled call"


async def test_output_is_capped_with_a_marker(tools: WorkingTools) -> None:
    result = await tools.run("bash", {"command": "seq 1 100000"})
    assert len(result.content) < 2200
    assert "[output truncated:" in result.content
    assert result.content.startswith("1\n2\n") and result.content.rstrip().endswith("100000")


async def test_a_flood_of_output_is_held_to_its_head_and_tail(workspace: Workspace) -> None:
    outcome = await workspace.run(
        ["/bin/sh", "-c", "printf start; head -c 3000000 /dev/zero | tr '\\0' x; printf end"],
        timeout=20,
        keep_bytes=1000,
    )
    assert outcome.exit_code == 0 and not outcome.timed_out
    assert outcome.output.startswith("start") and outcome.output.endswith("end")
    assert f"[output truncated: {3000008 - 1000} bytes cut]" in outcome.output
    assert len(outcome.output) < 1100


async def test_commands_see_no_corral_variable(tools: WorkingTools) -> None:
    result = await tools.run("bash", {"command": "env"})
    assert not result.is_error and "PATH=" in result.content
    assert "CORRAL_" not in result.content
    for name, value in SECRET_ENV.items():
        assert name not in result.content and value not in result.content


async def test_a_missing_program_is_named(workspace: Workspace) -> None:
    with pytest.raises(WorkspaceError) as missing:
        await workspace.run(["no-such-program-anywhere"], timeout=5, keep_bytes=100)
    assert missing.value.kind == "no_program"


# ------------------------------------------------------------------------------ the tree


async def test_instruction_files_come_through_the_workspace(
    workspace: Workspace, tree: Path
) -> None:
    cache = InstructionFileCache()
    files = await cache.refresh(workspace)
    assert [(f.relpath, f.text) for f in files] == [
        ("AGENTS.md", "root rules\n"),
        ("pkg/AGENTS.md", "pkg rules\n"),
    ]
    assert await cache.refresh(workspace) is files  # cached until told
    # Written the way a command would, in the same clock tick as the scan: seen after invalidate.
    (tree / "pkg" / "AGENTS.md").write_text("PKG RULES\n")
    (tree / "pkg" / "deep" / "AGENTS.md").write_text("deep rules\n")
    cache.invalidate(workspace.root)
    assert [f.text for f in await cache.refresh(workspace)] == [
        "root rules\n",
        "PKG RULES\n",
        "deep rules\n",
    ]


async def test_find_skips_the_content_of_unchanged_old_files(
    workspace: Workspace, tree: Path
) -> None:
    old = time.time() - 60
    os.utime(tree / "AGENTS.md", (old, old))
    stat = (tree / "AGENTS.md").stat()
    known = {"AGENTS.md": (stat.st_size, stat.st_mtime_ns), "pkg/AGENTS.md": (10, 1)}
    found = {f.path: f for f in await workspace.find("AGENTS.md", known, 1 << 20)}
    assert set(found) == {"AGENTS.md", "pkg/AGENTS.md"}
    assert found["AGENTS.md"].content is None
    assert found["pkg/AGENTS.md"].content == "pkg rules\n"


async def test_the_policy_checks_paths_through_the_workspace(
    workspace: Workspace, tree: Path
) -> None:
    policy = CorralTurnPolicy(workspace=workspace)
    c = ctx(tree, agent(allow=["*"]))
    policy.visible_tools(c, WORKING)

    async def outcome(name: str, tool_input: dict[str, Any]) -> str:
        return (await policy.decide_tool(c, ToolCall("t", name, tool_input))).outcome

    assert await outcome("write", {"path": "pkg/new.py", "content": ""}) == "allow"
    assert await outcome("write", {"path": "secret-link", "content": ""}) == "deny"
    assert await outcome("write", {"path": "dangling/x", "content": ""}) == "ask"
    assert await outcome("bash", {"command": "echo hi > link-out/x"}) == "deny"
    assert await outcome("bash", {"command": "echo hi > pkg/x"}) == "allow"
    assert await outcome("glob", {"pattern": "link-out/**"}) == "deny"
    facts = await policy.workspace_facts()
    assert facts.branch == "corral/test"
    assert "pkg/" in facts.entries and ".git" not in facts.entries and ".git/" not in facts.entries
    assert [f.relpath for f in facts.instruction_files] == ["AGENTS.md", "pkg/AGENTS.md"]


# ------------------------------------------------------------------------------ word for word

SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("read", {"path": "inside.txt"}),
    ("read", {"path": "inside.txt", "offset": 2, "limit": 1}),
    ("read", {"path": "inside.txt", "offset": 9}),
    ("read", {"path": "crlf.txt"}),
    ("read", {"path": "bytes.bin"}),
    ("read", {"path": "link-in/mod.py"}),
    ("read", {"path": "pkg"}),
    ("read", {"path": "nothing.txt"}),
    ("read", {"path": "../outside/secret.txt"}),
    ("read", {"path": "dangling/x"}),
    ("write", {"path": "new/dir/f.txt", "content": "a a b\n"}),
    ("write", {"path": "pkg", "content": "x"}),
    ("write", {"path": "inside.txt/below", "content": "x"}),
    ("edit", {"path": "new/dir/f.txt", "old_string": "a", "new_string": "z"}),
    ("edit", {"path": "new/dir/f.txt", "old_string": "a", "new_string": "z", "replace_all": True}),
    ("edit", {"path": "crlf.txt", "old_string": "second\r\n", "new_string": "2nd\r\n"}),
    ("read", {"path": "crlf.txt"}),
    ("edit", {"path": "bytes.bin", "old_string": "ok", "new_string": "x"}),
    ("edit", {"path": "inside.txt", "old_string": "nope", "new_string": "x"}),
    ("edit", {"path": "missing.txt", "old_string": "a", "new_string": "b"}),
    ("glob", {"pattern": "**/*.py"}),
    ("glob", {"pattern": "**"}),
    ("glob", {"pattern": "*"}),
    ("glob", {"pattern": "*/"}),
    ("glob", {"pattern": "pkg/*"}),
    ("glob", {"pattern": "[a-i]*.txt"}),
    ("glob", {"pattern": "link-in/*"}),
    ("glob", {"pattern": "*", "path": "pkg"}),
    ("glob", {"pattern": "**/AGENTS.md"}),
    ("glob", {"pattern": "nothing*"}),
    ("glob", {"pattern": "../*"}),
    ("grep", {"pattern": "needle"}),
    ("grep", {"pattern": "NEEDLE", "ignore_case": True, "path": "pkg"}),
    ("grep", {"pattern": "rules", "glob": "*.md"}),
    ("grep", {"pattern": "x", "path": "../outside"}),
    ("grep", {"pattern": "zzz-none"}),
    ("bash", {"command": "pwd; ls; cat new/dir/f.txt"}),
    ("bash", {"command": "echo oops >&2; exit 4"}),
    ("bash", {"command": "seq 1 5000"}),
    ("bash", {"command": "printf 'a\\342\\202b\\377c'"}),
    ("bash", {"command": "kill -TERM $$"}),
]


async def _answers(workspace: Workspace) -> list[tuple[str, bool]]:
    tools = WorkingTools(workspace, bash_timeout=5, output_cap=2000)
    answers = []
    for name, args in SCRIPT:
        result = await tools.run(name, args)
        answers.append((result.content, result.is_error))
    return answers


async def test_both_backends_answer_word_for_word(
    tmp_path: Path, secret_env: dict[str, str]
) -> None:
    root = build_tree(tmp_path).resolve()
    local = await _answers(LocalWorkspace(root))
    root = build_tree(tmp_path).resolve()
    service = ExecService(root, tmp_path / "sock" / "exec.sock", secret_env)
    client = ExecWorkspace(service.socket, root)
    try:
        remote = await _answers(client)
    finally:
        await client.aclose()
        service.stop()
    for (name, args), mine, theirs in zip(SCRIPT, local, remote, strict=True):
        assert mine == theirs, f"{name} {args}"
    # The script did reach every kind of answer.
    assert any(is_error for _, is_error in local) and any(not e for _, e in local)


def _age(root: Path, seconds: float = 600) -> None:
    """Make every file and directory look untouched for a while (a checkout from long ago)."""
    old = time.time() - seconds
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            os.utime(path, (old, old))


async def test_a_rescan_of_an_old_tree_still_sees_every_change(
    workspace: Workspace, tree: Path
) -> None:
    _age(tree)
    cache = InstructionFileCache()
    assert [f.relpath for f in await cache.refresh(workspace)] == ["AGENTS.md", "pkg/AGENTS.md"]
    # Unchanged: the second scan reads no file and lists no old directory, and says the same.
    cache.invalidate(workspace.root)
    assert [f.text for f in await cache.refresh(workspace)] == ["root rules\n", "pkg rules\n"]
    # A new file in an old directory, a rewrite in place of the same size, a new directory.
    (tree / "pkg" / "deep" / "AGENTS.md").write_text("deep rules\n")
    (tree / "pkg" / "AGENTS.md").write_text("PKG RULES\n")
    (tree / "fresh").mkdir()
    (tree / "fresh" / "AGENTS.md").write_text("fresh rules\n")
    (tree / "AGENTS.md").unlink()
    cache.invalidate(workspace.root)
    files = await cache.refresh(workspace)
    assert [(f.relpath, f.text) for f in files] == [
        ("fresh/AGENTS.md", "fresh rules\n"),
        ("pkg/AGENTS.md", "PKG RULES\n"),
        ("pkg/deep/AGENTS.md", "deep rules\n"),
    ]
    # A directory replaced by a symlink to the outside is not followed.
    renamed = tree / "pkg-old"
    (tree / "pkg").rename(renamed)
    os.symlink(_outside(tree), tree / "pkg")
    cache.invalidate(workspace.root)
    assert [f.relpath for f in await cache.refresh(workspace)] == [
        "fresh/AGENTS.md",
        "pkg-old/AGENTS.md",
        "pkg-old/deep/AGENTS.md",
    ]


async def test_a_fifo_is_neither_read_nor_written(tools: WorkingTools, tree: Path) -> None:
    os.mkfifo(tree / "pipe")  # opening it would block until someone opened the other end
    for name, args in (
        ("read", {"path": "pipe"}),
        ("write", {"path": "pipe", "content": "x"}),
        ("edit", {"path": "pipe", "old_string": "a", "new_string": "b"}),
    ):
        result = await asyncio.wait_for(tools.run(name, args), 10)
        assert result.is_error and result.content == "'pipe' is not a file", (name, result)
