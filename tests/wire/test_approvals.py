"""An `ask` outcome waits for a human through the file approval port, then runs or is refused.

The harness runs in this test process here (a real uvicorn server on loopback), because the
policy that asks is passed to `create_app` as an object.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from corral_common.approval_files import ApprovalFiles, Verdict
from corral_dev.ports import free_port
from corral_harness.config import HarnessConfig
from corral_harness.default_policy import DefaultPolicy
from corral_harness.ports import ToolCall, ToolDecision, TurnContext
from corral_harness.server import create_app

from ._rig import AGENT, FAST_ENV, Harness, Model

pytestmark = pytest.mark.timeout(60)


class AskForCommands(DefaultPolicy):
    """Every bash call needs a human."""

    async def decide_tool(self, ctx: TurnContext, call: ToolCall) -> ToolDecision:
        if call.name == "bash":
            return ToolDecision("ask", "commands need a human here")
        return await super().decide_tool(ctx, call)


@pytest.fixture
def asking_harness(tmp_path: Path, model: Model) -> Iterator[Harness]:
    env = {**FAST_ENV, "CORRAL_HARNESS_ADDR": f"127.0.0.1:{free_port()}",
           "CORRAL_STATE_DIR": str(tmp_path / "state"), "CORRAL_GRANTED_ROOT": str(tmp_path),
           "ANTHROPIC_BASE_URL": model.url}  # fmt: skip
    config = HarnessConfig.from_env(env)
    app = create_app(config, policy=AskForCommands())
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port,
                                           log_level="warning"))  # fmt: skip
    import threading

    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    harness = Harness(model.url, None, config.state_dir, tmp_path, port=config.port)
    yield harness
    server.should_exit = True
    thread.join(10)


def _decide(state: Path, approval_id: str, decision: str) -> dict[str, Any]:
    verdict: Verdict = "approved" if decision == "approved" else "denied"
    return ApprovalFiles(state / "approvals").decide(approval_id, verdict, by="the test")


def test_ask_waits_for_the_human_then_runs_or_refuses(
    asking_harness: Harness, model: Model, conv: str
) -> None:
    harness = asking_harness
    model.script(conv, [
        {"tool_uses": [{"name": "bash", "input": {"command": "touch approved.txt"}},
                       {"name": "bash", "input": {"command": "touch denied.txt"}}]},
        "done",
    ])  # fmt: skip
    admitted = harness.admit(conv, spec=AGENT)
    first = harness.wait_for(conv, "approval_requested")
    time.sleep(0.3)
    assert not (harness.root / "approved.txt").exists()  # nothing runs before the decision
    record = _decide(harness.state_dir, first["approvalId"], "approved")
    assert record["tool"] == "bash" and record["input"] == {"command": "touch approved.txt"}
    assert record["reason"] == "commands need a human here"
    deadline = time.monotonic() + 10
    while True:
        asks = [e for e in harness.history(conv) if e["type"] == "approval_requested"]
        if len(asks) == 2:
            break
        assert time.monotonic() < deadline
        time.sleep(0.02)
    _decide(harness.state_dir, asks[1]["approvalId"], "denied")
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["status"] == "completed"
    assert (harness.root / "approved.txt").exists()
    assert not (harness.root / "denied.txt").exists()
    blocked = [e for e in harness.history(conv) if e["type"] == "tool_blocked"]
    assert [b["outcome"] for b in blocked] == ["ask", "ask"]
    results = model.requests(conv)[1]["messages"][-1]["content"]
    assert "is_error" not in results[0]
    assert results[1]["is_error"] and "A human denied" in results[1]["content"]


def test_an_abort_ends_a_wait_for_a_human(asking_harness: Harness, model: Model, conv: str) -> None:
    harness = asking_harness
    model.script(conv, [{"tool_use": {"name": "bash", "input": {"command": "touch x"}}}])
    admitted = harness.admit(conv, spec=AGENT)
    harness.wait_for(conv, "approval_requested")
    assert httpx.post(f"{harness.url}/agents/agent/{conv}/abort").json() == {"aborted": True}
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["status"] == "aborted"
    assert not (harness.root / "x").exists()
