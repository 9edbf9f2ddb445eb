"""The test-side client of the scripted model server (corral_dev.scripted): load a script,
read what it received, and the tool results the agent saw. Shared by the cluster, attack and
node tiers."""

from __future__ import annotations

from typing import Any

import httpx


def load_script(model_url: str, script: dict[str, Any]) -> None:
    httpx.post(f"{model_url}/_script", json=script, timeout=10).raise_for_status()


def model_requests(model_url: str, conversation: str) -> list[dict[str, Any]]:
    found = httpx.get(f"{model_url}/_requests", params={"conversation": conversation}, timeout=10)
    found.raise_for_status()
    body = found.json()
    return list(body["requests"] if isinstance(body, dict) else body)


def tool_results(requests: list[dict[str, Any]]) -> list[str]:
    """The tool results the model received, in order, from its last request."""
    out: list[str] = []
    for message in requests[-1]["body"]["messages"]:
        for block in message.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                content = block.get("content")
                if isinstance(content, list):
                    content = "".join(str(c.get("text", "")) for c in content)
                out.append(str(content))
    return out
