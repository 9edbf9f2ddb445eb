"""Builds one assistant message from Messages-API stream events, and knows what is kept on a cut."""

from __future__ import annotations

import json
from typing import Any

from .seam import Usage


class MessageBuilder:
    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, str] = {}
        self._closed: set[int] = set()
        self.stop_reason = ""
        self.usage: dict[str, int] = {}
        self.forwarded = False  # real content has reached the turn: no retry after this
        self.finished = False  # message_stop seen

    def on_event(self, event: Any) -> None:
        kind = event.type
        if kind == "message_start":
            self._take_usage(getattr(event.message, "usage", None))
        elif kind == "content_block_start":
            self._start(event.index, event.content_block)
        elif kind == "content_block_delta":
            self._delta(event.index, event.delta)
        elif kind == "content_block_stop":
            self._stop(event.index)
        elif kind == "message_delta":
            self.stop_reason = getattr(event.delta, "stop_reason", None) or self.stop_reason
            self._take_usage(getattr(event, "usage", None))
        elif kind == "message_stop":
            self.finished = True

    def _take_usage(self, usage: Any) -> None:
        if usage is None:
            return
        for key in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ):
            value = getattr(usage, key, None)
            if value is not None:
                self.usage[key] = int(value)

    def _start(self, index: int, block: Any) -> None:
        kind = block.type
        if kind == "text":
            self.blocks[index] = {"type": "text", "text": block.text or ""}
        elif kind == "thinking":
            self.blocks[index] = {
                "type": "thinking",
                "thinking": block.thinking or "",
                "signature": block.signature or "",
            }
        elif kind == "redacted_thinking":
            self.blocks[index] = {"type": "redacted_thinking", "data": block.data}
        elif kind == "tool_use":
            self.blocks[index] = {
                "type": "tool_use",
                "id": block.id,
                "name": block.name,
                "input": {},
            }
            self._json[index] = ""
            self.forwarded = True
        else:
            self.blocks[index] = block.model_dump(mode="json", exclude_none=True)
        if self.blocks[index].get("text"):
            self.forwarded = True

    def _delta(self, index: int, delta: Any) -> None:
        block = self.blocks.get(index)
        if block is None:
            return
        kind = delta.type
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta.text
            self.forwarded = self.forwarded or bool(delta.text)
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.thinking
            self.forwarded = True
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta.signature
        elif kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + delta.partial_json
            self.forwarded = True

    def _stop(self, index: int) -> None:
        block = self.blocks.get(index)
        if block is not None and block["type"] == "tool_use":
            raw = self._json.get(index, "")
            try:
                parsed = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError:
                parsed = {"__unparsable__": raw}
            block["input"] = parsed
        self._closed.add(index)

    def message(self) -> dict[str, Any]:
        return {"role": "assistant", "content": [self.blocks[i] for i in sorted(self.blocks)]}

    def partial_message(self) -> dict[str, Any]:
        """What survives a cut: text, closed tool calls, and signed thinking."""
        kept: list[dict[str, Any]] = []
        for i in sorted(self.blocks):
            block = self.blocks[i]
            if self._survives(i, block):
                kept.append(block)
        return {"role": "assistant", "content": kept}

    def _survives(self, index: int, block: dict[str, Any]) -> bool:
        if block["type"] == "text":
            return bool(block.get("text"))
        if block["type"] == "tool_use":
            return index in self._closed
        if block["type"] == "thinking":
            return bool(block.get("signature")) and index in self._closed
        return False

    def final_usage(self) -> Usage | None:
        if not self.usage:
            return None
        return Usage(
            input=self.usage.get("input_tokens", 0),
            output=self.usage.get("output_tokens", 0),
            cache_read=self.usage.get("cache_read_input_tokens", 0),
            cache_write=self.usage.get("cache_creation_input_tokens", 0),
        )
