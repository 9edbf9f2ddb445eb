"""Hooks on the real harness: an after-generation denial stops the run before its calls run."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from corral_dev.ports import free_port
from corral_harness.config import HarnessConfig
from corral_harness.hooks import HookEvent, HookResult, Hooks, Phase, allow, deny
from corral_harness.policy.turn_policy import CorralTurnPolicy
from corral_harness.server import create_app

from ._rig import AGENT, FAST_ENV, Harness, Model

pytestmark = pytest.mark.timeout(60)


def refuse_deletions(event: HookEvent) -> HookResult:
    for message in event.messages:
        for block in message.get("content", []):
            if block.get("type") == "tool_use" and "rm " in str(block.get("input")):
                return deny("deleting files is not allowed in this repository")
    return allow()


@pytest.fixture
def hooked_harness(tmp_path: Path, model: Model) -> Iterator[Harness]:
    env = {**FAST_ENV, "CORRAL_HARNESS_ADDR": f"127.0.0.1:{free_port()}",
           "CORRAL_STATE_DIR": str(tmp_path / "state"), "CORRAL_GRANTED_ROOT": str(tmp_path),
           "ANTHROPIC_BASE_URL": model.url}  # fmt: skip
    config = HarnessConfig.from_env(env)
    hooks = Hooks().with_handler(Phase.AFTER_GENERATION, refuse_deletions)
    policy = CorralTurnPolicy(granted_root=tmp_path, hooks=hooks)
    app = create_app(config, policy=policy)
    server = uvicorn.Server(
        uvicorn.Config(app, host=config.host, port=config.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield Harness(model.url, None, config.state_dir, tmp_path, port=config.port)
    server.should_exit = True
    thread.join(10)


def _events(harness: Harness, conv: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in harness.history(conv) if e["type"] == kind]


def test_an_after_generation_denial_stops_the_run_and_its_calls_never_run(
    hooked_harness: Harness, model: Model, conv: str
) -> None:
    harness = hooked_harness
    (harness.root / "keep.txt").write_text("precious")
    model.script(
        conv,
        [{"tool_use": {"name": "bash", "input": {"command": "rm keep.txt"}}}, "never asked"],
    )
    settled = harness.wait_settled(conv, harness.admit(conv, spec=AGENT)["submissionId"])
    assert settled["status"] == "failed"
    assert settled["error"]["type"] == "hook_denied"
    assert "deleting files" in settled["error"]["message"]
    assert (harness.root / "keep.txt").read_text() == "precious"
    assert len(model.requests(conv)) == 1  # no model request after the denial
    (blocked,) = _events(harness, conv, "tool_blocked")
    assert blocked["name"] == "bash" and blocked["outcome"] == "deny"


def test_an_answer_the_hook_allows_runs_normally(
    hooked_harness: Harness, model: Model, conv: str
) -> None:
    harness = hooked_harness
    model.script(conv, [{"tool_use": {"name": "bash", "input": {"command": "touch made"}}}, "ok"])
    settled = harness.wait_settled(conv, harness.admit(conv, spec=AGENT)["submissionId"])
    assert settled["status"] == "completed"
    assert (harness.root / "made").exists()
