"""What the scripted agent saw: the tool results in the model's last request, in order."""

from __future__ import annotations

from typing import Any


def tool_results(requests: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for message in requests[-1]["body"]["messages"]:
        for block in message.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                content = block.get("content")
                if isinstance(content, list):
                    content = "".join(str(c.get("text", "")) for c in content)
                out.append(str(content))
    return out
