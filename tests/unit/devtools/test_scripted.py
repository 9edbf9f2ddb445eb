"""The scripted model's HTTP surface: non-streaming replies, recording, script loading, refusals."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from corral_dev.scripted import EXHAUSTED, load_script
from tests._scripted import ScriptedServer

pytestmark = pytest.mark.timeout(30)


def _ask(scripted: ScriptedServer, conv: str, messages: list[dict[str, object]]) -> httpx.Response:
    body = {"model": "m", "max_tokens": 10, "messages": messages, "metadata": {"user_id": conv}}
    return httpx.post(f"{scripted.url}/v1/messages", json=body)


def test_non_streaming_replies_and_recording(scripted: ScriptedServer) -> None:
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
    assert httpx.post(f"{scripted.url}/_script", json=script).json() == {"ok": True}
    answer = _ask(scripted, "ns", [{"role": "user", "content": "go"}]).json()
    assert answer["type"] == "message" and answer["stop_reason"] == "tool_use"
    assert [b["type"] for b in answer["content"]] == ["text", "tool_use"]
    assert answer["content"][1]["id"].startswith("toolu_")
    assert answer["usage"]["input_tokens"] == 7
    exhausted = _ask(scripted, "ns", [{"role": "user", "content": "again"}]).json()
    assert exhausted["content"][0]["text"] == EXHAUSTED
    recorded = httpx.get(f"{scripted.url}/_requests", params={"conversation": "ns"}).json()
    assert [r["body"]["messages"][0]["content"] for r in recorded] == ["go", "again"]


def test_refuses_orphan_tool_uses_like_the_provider(scripted: ScriptedServer) -> None:
    response = _ask(
        scripted,
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


def test_bad_scripts_are_refused(scripted: ScriptedServer, tmp_path: Path) -> None:
    response = httpx.post(f"{scripted.url}/_script", json={"default": [{"bogus": 1}]})
    assert response.status_code == 400 and "bogus" in response.json()["error"]
    path = tmp_path / "s.yaml"
    path.write_text("default:\n  - text: hello\n    repeat: 3\n")
    assert len(load_script(path).default) == 3


def test_a_failed_check_without_otherwise_is_a_400(scripted: ScriptedServer) -> None:
    script = {"conversations": {"chk": [{"when": {"last_user_contains": "magic"}, "text": "ok"}]}}
    httpx.post(f"{scripted.url}/_script", json=script)
    response = _ask(scripted, "chk", [{"role": "user", "content": "plain"}])
    assert response.status_code == 400
    assert "script check failed" in response.json()["error"]["message"]
