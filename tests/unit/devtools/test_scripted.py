"""The scripted model's HTTP surface: non-streaming replies, recording, script loading, refusals."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral_dev.scripted import (
    EXHAUSTED,
    RunningServer,
    ScriptedModel,
    load_script,
    serve_in_thread,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = serve_in_thread(ScriptedModel())
    yield running
    running.stop()


def _ask(server: RunningServer, conv: str, messages: list[dict[str, object]]) -> httpx.Response:
    body = {"model": "m", "max_tokens": 10, "messages": messages, "metadata": {"user_id": conv}}
    return httpx.post(f"{server.url}/v1/messages", json=body)


def test_non_streaming_replies_and_recording(server: RunningServer) -> None:
    script = {
        "conversations": {
            "ns": [
                {
                    "text": "hi",
                    "tool_use": {"name": "bash", "input": {"command": "ls"}},
                    "usage": {"input_tokens": 7},
                }
            ]
        }
    }
    assert httpx.post(f"{server.url}/_script", json=script).json() == {"ok": True}
    answer = _ask(server, "ns", [{"role": "user", "content": "go"}]).json()
    assert answer["type"] == "message" and answer["stop_reason"] == "tool_use"
    assert [b["type"] for b in answer["content"]] == ["text", "tool_use"]
    assert answer["content"][1]["id"].startswith("toolu_")
    assert answer["usage"]["input_tokens"] == 7
    exhausted = _ask(server, "ns", [{"role": "user", "content": "again"}]).json()
    assert exhausted["content"][0]["text"] == EXHAUSTED
    recorded = httpx.get(f"{server.url}/_requests", params={"conversation": "ns"}).json()
    assert [r["body"]["messages"][0]["content"] for r in recorded] == ["go", "again"]


def test_refuses_orphan_tool_uses_like_the_provider(server: RunningServer) -> None:
    response = _ask(
        server,
        "orphan",
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}],
            },
            {"role": "user", "content": [{"type": "text", "text": "no result"}]},
        ],
    )
    assert response.status_code == 400
    assert "t1" in response.json()["error"]["message"]


def test_bad_scripts_are_refused(server: RunningServer, tmp_path: Path) -> None:
    response = httpx.post(f"{server.url}/_script", json={"default": [{"bogus": 1}]})
    assert response.status_code == 400 and "bogus" in response.json()["error"]
    path = tmp_path / "s.yaml"
    path.write_text("default:\n  - text: hello\n    repeat: 3\n")
    assert len(load_script(path).default) == 3


def test_a_failed_check_without_otherwise_is_a_400(server: RunningServer) -> None:
    script = {"conversations": {"chk": [{"when": {"last_user_contains": "magic"}, "text": "ok"}]}}
    httpx.post(f"{server.url}/_script", json=script)
    response = _ask(server, "chk", [{"role": "user", "content": "plain"}])
    assert response.status_code == 400
    assert "script check failed" in response.json()["error"]["message"]
