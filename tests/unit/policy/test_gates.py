"""Ask, the granted root, read-only, and proof that a refused call never runs."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral_common.approval_files import ApprovalScopeMismatch
from corral_harness.approvals.file_port import FileApprovalPort
from corral_harness.approvals.settle import call_digest, settle_ask
from corral_harness.paths import GrantedRoot
from corral_harness.policy import shell_ask_reason
from corral_harness.policy.turn_policy import CorralTurnPolicy
from corral_harness.ports import ToolCall, TurnContext

from ._helpers import WORKING, agent, ctx, menu


async def run_gated(
    policy: CorralTurnPolicy, c: TurnContext, call: ToolCall, store: FileApprovalPort
) -> str:
    """What a turn does with one call: decide, settle an ask through a human, then run for real.

    `write` writes a real file and `bash` runs a real process, so a refused call leaves a trace
    only if the gate failed.
    """
    decision = await policy.decide_tool(c, call)
    decision = await settle_ask(decision, c, call, store)
    if decision.outcome != "allow":
        return f"blocked: {decision.reason}"
    tool_input: dict[str, Any] = decision.input or call.input
    if call.name == "write":
        target = GrantedRoot(policy.workspace.root).resolve(tool_input["path"])
        target.write_text(tool_input["content"])
        return "written"
    if call.name == "bash":
        done = subprocess.run(
            tool_input["command"],
            shell=True,
            cwd=policy.workspace.root,
            capture_output=True,
            timeout=10,
        )
        return f"exit {done.returncode}"
    return "ran"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    return root


@pytest.fixture
def store(tmp_path: Path) -> FileApprovalPort:
    return FileApprovalPort(tmp_path / "approvals", poll_seconds=0.02)


def _policy(root: Path, **kw: Any) -> tuple[CorralTurnPolicy, TurnContext]:
    policy = CorralTurnPolicy(granted_root=root, **kw)
    c = ctx(root, agent(allow=["*"], deny=["grep"]), read_only=kw.get("read_only", False))
    policy.visible_tools(c, [*WORKING, menu("land"), menu("push")])
    return policy, c


@pytest.mark.timeout(10)
async def test_a_denied_call_never_runs(workspace: Path, store: FileApprovalPort) -> None:
    policy, c = _policy(workspace)
    call = ToolCall("t1", "grep", {"pattern": "x"})
    assert (await policy.decide_tool(c, call)).outcome == "deny"
    sentinel = workspace / "ran"
    bad = ToolCall("t2", "mcp__corral__approve", {"command": f"touch {sentinel}"})
    assert (await run_gated(policy, c, bad, store)).startswith("blocked")
    assert not sentinel.exists()
    assert store.files.pending() == []


@pytest.mark.timeout(10)
@pytest.mark.parametrize("path", ["../escaped.txt", "/tmp/corral-escape-test.txt", "link/x.txt"])
async def test_a_write_escaping_the_root_never_runs(
    workspace: Path, store: FileApprovalPort, tmp_path: Path, path: str
) -> None:
    os.symlink(tmp_path, workspace / "link")
    policy, c = _policy(workspace)
    call = ToolCall("t1", "write", {"path": path, "content": "pwned"})
    decision = await policy.decide_tool(c, call)
    assert decision.outcome == "deny" and "outside the granted root" in decision.reason
    assert (await run_gated(policy, c, call, store)).startswith("blocked")
    assert not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path / "x.txt").exists()
    assert not Path("/tmp/corral-escape-test.txt").exists()


@pytest.mark.timeout(10)
async def test_an_uncertain_path_asks(workspace: Path) -> None:
    os.symlink(workspace / "missing-dir", workspace / "dangling")
    policy, c = _policy(workspace)
    decision = await policy.decide_tool(c, ToolCall("t1", "write", {"path": "dangling/f"}))
    assert decision.outcome == "ask" and "may leave" in decision.reason
    weird = await policy.decide_tool(c, ToolCall("t2", "read", {"path": ["a", "b"]}))
    assert weird.outcome == "ask"


@pytest.mark.timeout(10)
async def test_an_inside_write_runs(workspace: Path, store: FileApprovalPort) -> None:
    policy, c = _policy(workspace)
    call = ToolCall("t1", "write", {"path": "sub.txt", "content": "ok"})
    assert await run_gated(policy, c, call, store) == "written"
    assert (workspace / "sub.txt").read_text() == "ok"


@pytest.mark.parametrize(
    "command",
    [
        "git merge feature",
        "git -C repo rebase main",
        "cd x && git pull",
        "git push origin HEAD:main",
        "git push --force origin corral/s1",
        "git push origin +corral/s1",
        "kubectl -n prod apply -f x.yaml",
        "kubectl patch deploy x -p '{}'",
        "kubectl delete pod y",
    ],
)
def test_irreversible_shell_commands_ask(command: str) -> None:
    assert shell_ask_reason(command) is not None


@pytest.mark.parametrize(
    "command", ["git status", "git push origin corral/s1", "kubectl get pods", "echo merged"]
)
def test_ordinary_shell_commands_do_not_ask(command: str) -> None:
    assert shell_ask_reason(command) is None


async def test_land_and_cluster_tools_always_ask_even_when_allowed(workspace: Path) -> None:
    policy, c = _policy(workspace)
    land = await policy.decide_tool(c, ToolCall("t1", "mcp__corral__land", {"target": "main"}))
    assert land.outcome == "ask"
    push = await policy.decide_tool(c, ToolCall("t2", "mcp__corral__push", {}))
    assert push.outcome == "allow"


@pytest.mark.timeout(10)
async def test_ask_waits_for_a_human_then_replays_the_same_call(
    workspace: Path, store: FileApprovalPort
) -> None:
    policy, c = _policy(workspace)
    call = ToolCall("t1", "bash", {"command": "git merge topic 2>/dev/null; touch merged"})
    task = asyncio.create_task(run_gated(policy, c, call, store))
    while not store.files.pending():
        await asyncio.sleep(0.01)
    (pending,) = store.files.pending()
    assert pending["tool"] == "bash" and pending["input"] == call.input
    assert not (workspace / "merged").exists()  # nothing ran while waiting
    store.files.decide(
        pending["id"], "approved", by="t", scope="conv-1", digest=call_digest("bash", call.input)
    )
    assert (await task).startswith("exit")
    assert (workspace / "merged").exists()


@pytest.mark.timeout(10)
async def test_a_denied_ask_never_runs(workspace: Path, store: FileApprovalPort) -> None:
    policy, c = _policy(workspace)
    call = ToolCall("t1", "bash", {"command": "git rebase main; touch rebased"})
    task = asyncio.create_task(run_gated(policy, c, call, store))
    while not store.files.pending():
        await asyncio.sleep(0.01)
    (pending,) = store.files.pending()
    store.files.decide(pending["id"], "denied", by="t", scope="conv-1", digest=pending["digest"])
    assert (await task).startswith("blocked: denied by a human")
    assert not (workspace / "rebased").exists()


@pytest.mark.timeout(10)
async def test_a_decision_from_another_scope_or_call_releases_nothing(
    workspace: Path, store: FileApprovalPort
) -> None:
    policy, c = _policy(workspace)
    call = ToolCall("t1", "mcp__corral__land", {"target": "main"})
    task = asyncio.create_task(run_gated(policy, c, call, store))
    while not store.files.pending():
        await asyncio.sleep(0.01)
    (pending,) = store.files.pending()
    with pytest.raises(ApprovalScopeMismatch):
        store.files.decide(
            pending["id"], "approved", by="t", scope="other-conv", digest=pending["digest"]
        )
    other = call_digest("mcp__corral__land", {"target": "release"})
    with pytest.raises(ApprovalScopeMismatch):
        store.files.decide(pending["id"], "approved", by="t", scope="conv-1", digest=other)
    await asyncio.sleep(0.05)
    assert not task.done()
    task.cancel()


async def test_read_only_refuses_writes_and_commands(
    workspace: Path, store: FileApprovalPort
) -> None:
    policy, c = _policy(workspace, read_only=True)
    shown = [t.name for t in policy.visible_tools(c, WORKING)]
    assert "write" not in shown and "edit" not in shown and "bash" not in shown
    assert "read" in shown
    for name, args in (("write", {"path": "f", "content": "x"}), ("bash", {"command": "touch f"})):
        decision = await policy.decide_tool(c, ToolCall("t", name, args))
        assert decision.outcome == "deny" and "read-only" in decision.reason
        assert (await run_gated(policy, c, ToolCall("t", name, args), store)).startswith("blocked")
    assert not (workspace / "f").exists()
    read = await policy.decide_tool(c, ToolCall("t", "read", {"path": "f"}))
    assert read.outcome == "allow"


async def test_a_read_only_turn_context_is_enough(workspace: Path) -> None:
    policy = CorralTurnPolicy(granted_root=workspace)  # not read-only itself
    c = ctx(workspace, read_only=True)
    policy.visible_tools(c, WORKING)
    decision = await policy.decide_tool(c, ToolCall("t", "edit", {"path": "a"}))
    assert decision.outcome == "deny"


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "command",
    [
        "echo pwned > ../escaped.txt",
        "echo pwned >>/tmp/corral-escape-test.txt",
        "echo pwned | tee -a ../escaped.txt",
        "cd .. && echo pwned > escaped.txt",
        "echo pwned &> link/escaped.txt",
    ],
)
async def test_a_shell_write_escaping_the_root_never_runs(
    workspace: Path, store: FileApprovalPort, tmp_path: Path, command: str
) -> None:
    os.symlink(tmp_path, workspace / "link")
    policy, c = _policy(workspace)
    call = ToolCall("t1", "bash", {"command": command})
    decision = await policy.decide_tool(c, call)
    assert decision.outcome == "deny" and "outside the granted root" in decision.reason
    assert (await run_gated(policy, c, call, store)).startswith("blocked")
    assert not (tmp_path / "escaped.txt").exists()
    assert not Path("/tmp/corral-escape-test.txt").exists()


@pytest.mark.parametrize(
    "command", ["make test 2>&1 | tee out.log", "ls 2>/dev/null", "cd sub && echo x > y.txt"]
)
async def test_shell_writes_inside_the_root_are_allowed(workspace: Path, command: str) -> None:
    policy, c = _policy(workspace)
    assert (await policy.decide_tool(c, ToolCall("t", "bash", {"command": command}))).outcome == (
        "allow"
    )


async def test_a_shell_path_built_by_expansion_asks(workspace: Path) -> None:
    policy, c = _policy(workspace)
    decision = await policy.decide_tool(c, ToolCall("t", "bash", {"command": "echo x > $HOME/y"}))
    assert decision.outcome == "ask"


@pytest.mark.parametrize(
    ("pattern", "outcome"),
    [
        ("src/**/*.py", "allow"),
        ("../**/*.py", "deny"),
        ("/etc/*", "deny"),
        ("*/../../*", "ask"),
    ],
)
async def test_glob_patterns_stay_inside(workspace: Path, pattern: str, outcome: str) -> None:
    policy, c = _policy(workspace)
    decision = await policy.decide_tool(c, ToolCall("t", "glob", {"pattern": pattern}))
    assert decision.outcome == outcome, decision.reason
