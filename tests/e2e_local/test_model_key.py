"""With ANTHROPIC_API_KEY set, `corral run` sends model calls to ANTHROPIC_BASE_URL through the
custodian, which alone holds the key: the agent's shell cannot read it from its environment.

The "Anthropic API" here is the scripted model server (a real process), so no network is used;
it records the headers each request arrived with.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from corral_cli import _processes as proc

from .conftest import read_lines, run_argv, run_env, write_session

pytestmark = pytest.mark.timeout(90)

KEY = "sk-ant-test-0123456789"


@pytest.fixture
async def upstream(tmp_path: Path) -> AsyncIterator[str]:
    script = tmp_path / "upstream.json"
    script.write_text(
        json.dumps(
            {
                "default": [
                    {
                        "tool_use": {
                            "name": "bash",
                            "input": {
                                "command": "printenv ANTHROPIC_API_KEY || echo no-key-in-my-env"
                            },
                        }
                    },
                    {"text": "Done."},
                ]
            }
        )
    )
    parts = proc.Parts(tmp_path / "upstream-logs")
    port = proc.free_port()
    model = parts.start("upstream", proc.scripted_argv(port, script), proc.base_env(), port)
    try:
        await parts.wait_ready(model, "/_requests")
        yield model.url
    finally:
        parts.stop()


async def test_the_key_goes_to_the_custodian_and_upstream_only(
    upstream: str, demo_workspace: Path, tmp_path: Path
) -> None:
    session, _ = write_session(tmp_path, scenario_replies=[], evaluation=None)
    state_dir = tmp_path / "state"
    env = run_env() | {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": upstream}
    done = subprocess.run(
        [*run_argv(session, demo_workspace, state_dir), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr + done.stdout

    async with httpx.AsyncClient() as http:
        requests = (await http.get(f"{upstream}/_requests")).json()
    assert len(requests) == 2
    for request in requests:
        assert request["headers"]["x-api-key"] == KEY  # added by the custodian
        assert request["body"]["model"] == "claude-sonnet-4-5"  # the Agent's, not the demo's

    ran = [e for e in read_lines(state_dir / "transcript.jsonl") if e["type"] == "tool_end"]
    assert ran and "no-key-in-my-env" in ran[0]["result"]
    for path in (
        state_dir / "transcript.jsonl",
        state_dir / "ledger.jsonl",
        state_dir / "state.json",
    ):
        assert KEY not in path.read_text()
    # The key is on disk only in the custodian's 0600 file.
    key_file = state_dir / "secrets" / "model-key"
    assert key_file.read_text() == KEY
    assert os.stat(key_file).st_mode & 0o077 == 0
