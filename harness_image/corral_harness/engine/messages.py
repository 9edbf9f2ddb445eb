"""Provider-message housekeeping shared by every engine: pure functions over message dicts."""

from __future__ import annotations

from typing import Any

from .seam import DID_NOT_RUN

_API_KEYS = ("role", "content")


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if b.get("type") == "text")


def user_text(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def tool_results_message(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """A user message of tool results, marked so the transcript joins a later result to it."""
    return {"role": "user", "content": blocks, "tool_results": True}


def tool_result_block(tool_use_id: str, content: str, is_error: bool) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
    if is_error:
        block["is_error"] = True
    return block


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    # Blocks are shared, not copied: nothing below mutates a block, only the lists holding them.
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [b for b in content or [] if not (b.get("type") == "text" and not b.get("text"))]


def for_provider(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as the provider accepts them.

    Only role and content are kept; empty text blocks go; consecutive messages of one role are
    merged; every tool_use gets a tool_result in the next user message (a call with none gets the
    "did not run" error); a tool_result whose tool_use is not in the message before it is
    dropped; tool results come first in their user message. The conversation starts with a
    user message.
    """
    merged: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role not in ("user", "assistant"):
            continue
        blocks = _blocks(message)
        if not blocks:
            continue
        if merged and merged[-1]["role"] == role:
            merged[-1]["content"].extend(blocks)
        else:
            merged.append({"role": role, "content": blocks})
    while merged and merged[0]["role"] != "user":
        merged.pop(0)

    out: list[dict[str, Any]] = []
    for i, message in enumerate(merged):
        if message["role"] == "assistant":
            out.append(message)
            continue
        previous = merged[i - 1] if i > 0 else None
        asked = [
            b["id"]
            for b in (previous["content"] if previous else [])
            if b.get("type") == "tool_use"
        ]
        results = {
            b["tool_use_id"]: b
            for b in message["content"]
            if b.get("type") == "tool_result" and b.get("tool_use_id") in asked
        }
        others = [b for b in message["content"] if b.get("type") != "tool_result"]
        answered = [results.get(uid) or tool_result_block(uid, DID_NOT_RUN, True) for uid in asked]
        content = answered + others
        if content:
            out.append({"role": "user", "content": content})
    # An assistant answer whose calls have no user message after it yet.
    if out and out[-1]["role"] == "assistant":
        asked = [b["id"] for b in out[-1]["content"] if b.get("type") == "tool_use"]
        if asked:
            out.append(
                {
                    "role": "user",
                    "content": [tool_result_block(u, DID_NOT_RUN, True) for u in asked],
                }
            )
    return out
