"""The harness with CORRAL_EXEC_SOCKET: every working tool goes to a real corral-exec.

The harness is told its granted root is a path that does not exist on its side (in a pod the
workspace is mounted in the tools container only); the service serves a temporary directory.
Anything that lands in that directory, or reads from it, went through the exec hop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..unit.tools_exec._service import ExecService, pid_dead, wait_dead
from ._rig import Harness, MenuStandIn, Model

pytestmark = pytest.mark.timeout(60)

HARNESS_SIDE_ROOT = Path("/corral-not-mounted/workspace")


@pytest.fixture
def tools_root(tmp_path: Path) -> Path:
    root = tmp_path / "tools-root"
    (root / "pkg").mkdir(parents=True)
    (root / "AGENTS.md").write_text("EXEC-SIDE-RULE: tabs only\n")
    (root / "pkg" / "AGENTS.md").write_text("PKG-RULE: small functions\n")
    return root.resolve()


@pytest.fixture
def service(tmp_path: Path, tools_root: Path) -> Iterator[ExecService]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "ANTHROPIC_"))}
    env["TOOLS_CONTAINER_MARKER"] = "seen-in-the-tools-container"
    env["CORRAL_SERVICE_ONLY"] = "must-not-reach-commands"
    running = ExecService(tools_root, tmp_path / "shared" / "exec.sock", env)
    yield running
    running.stop()


@pytest.fixture
def exec_harness(
    tmp_path: Path, model: Model, menu: tuple[MenuStandIn, str], service: ExecService
) -> Iterator[Harness]:
    (tmp_path / "state").mkdir()
    harness = Harness(
        model.url,
        menu[1],
        tmp_path / "state",
        HARNESS_SIDE_ROOT,
        extra_env={"CORRAL_EXEC_SOCKET": str(service.socket)},
    )
    harness.start()
    yield harness
    harness.stop()


def _results(model: Model, conv: str) -> list[dict[str, Any]]:
    """Every tool_result the model was sent, in order."""
    last = model.requests(conv)[-1]["messages"]
    return [
        block
        for message in last
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


def test_write_read_and_bash_go_through_the_exec_service(
    exec_harness: Harness, model: Model, conv: str, tools_root: Path
) -> None:
    assert not HARNESS_SIDE_ROOT.exists()
    model.script(
        conv,
        [
            {
                "tool_use": {
                    "name": "write",
                    "input": {"path": "notes/hello.txt", "content": "hi\n"},
                }
            },
            {"tool_use": {"name": "read", "input": {"path": "notes/hello.txt"}}},
            {
                "tool_use": {
                    "name": "bash",
                    "input": {"command": "cat notes/hello.txt; pwd; env | sort"},
                }
            },
            {"tool_use": {"name": "write", "input": {"path": "../escape.txt", "content": "x"}}},
            "done",
        ],
    )
    settled = exec_harness.wait_settled(conv, exec_harness.admit(conv)["submissionId"])
    assert settled["status"] == "completed", settled
    assert (tools_root / "notes" / "hello.txt").read_text() == "hi\n"
    assert not (tools_root.parent / "escape.txt").exists()

    written, read, ran = (r["content"] for r in _results(model, conv)[:3])
    assert written == "wrote 3 bytes to notes/hello.txt"
    assert read == "     1\thi"
    output = ran if isinstance(ran, str) else ran[0]["text"]
    lines = output.splitlines()
    assert lines[:2] == ["hi", str(tools_root)]
    assert "TOOLS_CONTAINER_MARKER=seen-in-the-tools-container" in lines
    assert not any(line.startswith(("CORRAL_", "ANTHROPIC_")) for line in lines)
    blocked = [e for e in exec_harness.history(conv) if e["type"] == "tool_blocked"]
    assert blocked and "outside the granted root" in blocked[0]["reason"]

    # The instruction files and the project context came from the tools side too.
    system = model.requests(conv)[0]["system"]
    text = system if isinstance(system, str) else " ".join(b["text"] for b in system)
    assert "EXEC-SIDE-RULE" in text and "PKG-RULE" in text
    assert f"Workspace (granted root): {HARNESS_SIDE_ROOT}" in text
    assert "Top-level entries: AGENTS.md, pkg/" in text


def test_an_agents_md_written_by_bash_is_seen_at_the_next_step(
    exec_harness: Harness, model: Model, conv: str
) -> None:
    command = "mkdir -p late && echo 'LATE-RULE: written by bash' > late/AGENTS.md"
    model.script(conv, [{"tool_use": {"name": "bash", "input": {"command": command}}}, "done"])
    settled = exec_harness.wait_settled(conv, exec_harness.admit(conv)["submissionId"])
    assert settled["status"] == "completed", settled
    first, second = (r["system"] for r in model.requests(conv))
    assert "LATE-RULE" not in str(first) and "LATE-RULE" in str(second)


def test_an_abort_kills_the_command_in_the_tools_container(
    exec_harness: Harness, model: Model, conv: str, tools_root: Path
) -> None:
    command = "sleep 300 & echo $! > bg.pid; wait"
    model.script(conv, [{"tool_use": {"name": "bash", "input": {"command": command}}}, "x"])
    admitted = exec_harness.admit(conv)
    deadline = time.monotonic() + 10
    while not (tools_root / "bg.pid").exists() or not (tools_root / "bg.pid").read_text():
        assert time.monotonic() < deadline, "the command did not start"
        time.sleep(0.02)
    pid = int((tools_root / "bg.pid").read_text())
    try:
        assert not pid_dead(pid)
        assert exec_harness.abort(conv)
        settled = exec_harness.wait_settled(conv, admitted["submissionId"])
        assert settled["status"] == "aborted"
        assert wait_dead(pid), "the backgrounded sleep outlived the aborted turn"
    finally:
        if not pid_dead(pid):
            os.kill(pid, 9)


def test_checks_run_in_the_tools_container_and_readiness_follows_the_service(
    exec_harness: Harness, service: ExecService, tools_root: Path, model: Model, conv: str
) -> None:
    answer = exec_harness.post("/checks", {"command": "pwd; echo $TOOLS_CONTAINER_MARKER"})
    assert answer.status_code == 200
    assert answer.json()["output"] == f"{tools_root}\nseen-in-the-tools-container\n"
    assert httpx.get(f"{exec_harness.url}/readyz").status_code == 200
    service.stop()
    assert httpx.get(f"{exec_harness.url}/readyz").status_code == 503
    unable = exec_harness.post("/checks", {"command": "true"}).json()
    assert unable["exitCode"] == -1 and "could not run" in unable["output"]
    # A turn already admitted still settles: its tools say the service is away.
    model.script(conv, [{"tool_use": {"name": "bash", "input": {"command": "true"}}}, "done"])
    settled = exec_harness.wait_settled(conv, exec_harness.admit(conv)["submissionId"])
    assert settled["status"] == "completed", settled
    (result,) = _results(model, conv)
    assert result["is_error"] and "tools service is unavailable" in str(result["content"])
