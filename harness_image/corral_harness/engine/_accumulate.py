"""Builds one assistant message from Messages-API stream events, and knows what is kept on a cut.

Events come as the SDK's typed objects (the SDK adapter) or as the parsed JSON dicts of the
stream (the lean adapter); `_get` reads a field from either, and `_plain` turns a part the
harness does not interpret (a server tool's result, a citation) back into the JSON the API sent,
so both build the same message, and the next request sends such a part back as it came.
"""

from __future__ import annotations

import json
from typing import Any

from .seam import Usage

# The key a cut-off tool call's input is kept under: what streamed of its JSON, as it streamed.
PARTIAL_INPUT = "__partial_json__"
# Blocks whose input streams as `input_json_delta`: the harness's tool calls, and the calls of
# a tool the API runs itself (web search), which the harness never runs but must send back whole.
_STREAMED_INPUT = ("tool_use", "server_tool_use")


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _plain(obj: Any) -> Any:
    """A stream part as the API's JSON. The SDK builds its objects from that JSON without
    validation and remembers which fields it held: dumping only those gives the JSON back,
    its nulls and the fields the SDK has no name for included, as the lean adapter has it."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json", exclude_unset=True)
    return obj


class MessageBuilder:
    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, str] = {}
        self._closed: set[int] = set()
        self._unparsed: set[int] = set()  # tool calls stopped with input that is not an object
        self.stop_reason = ""
        self.usage: dict[str, int] = {}
        self.forwarded = False  # real content has reached the turn: no retry after this
        self.finished = False  # message_stop seen
        self.undecodable: list[str] = []  # events whose data was not JSON, kept as data

    def on_event(self, event: Any) -> None:
        kind = _get(event, "type")
        if kind == "message_start":
            self._take_usage(_get(_get(event, "message"), "usage"))
        elif kind == "content_block_start":
            self._start(_get(event, "index"), _get(event, "content_block"))
        elif kind == "content_block_delta":
            self._delta(_get(event, "index"), _get(event, "delta"))
        elif kind == "content_block_stop":
            self._stop(_get(event, "index"))
        elif kind == "message_delta":
            self.stop_reason = _get(_get(event, "delta"), "stop_reason") or self.stop_reason
            self._take_usage(_get(event, "usage"))
        elif kind == "message_stop":
            self.finished = True

    def on_undecodable(self, data: str) -> None:
        """An event that is not JSON (a line cut by a dropped connection): kept, not raised, so
        an `error` event after it still names the failure."""
        self.undecodable.append(data)

    def _take_usage(self, usage: Any) -> None:
        if usage is None:
            return
        for key in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ):
            value = _get(usage, key)
            if value is not None:
                self.usage[key] = int(value)

    def _start(self, index: int, block: Any) -> None:
        kind = _get(block, "type")
        if kind == "text":
            self.blocks[index] = {"type": "text", "text": _get(block, "text") or ""}
            citations = _get(block, "citations")
            if citations:  # usually none here: they stream as citations_delta
                self.blocks[index]["citations"] = [_plain(c) for c in citations]
        elif kind == "thinking":
            self.blocks[index] = {
                "type": "thinking",
                "thinking": _get(block, "thinking") or "",
                "signature": _get(block, "signature") or "",
            }
        elif kind == "redacted_thinking":
            self.blocks[index] = {"type": "redacted_thinking", "data": _get(block, "data")}
        elif kind == "tool_use":
            self.blocks[index] = {
                "type": "tool_use",
                "id": _get(block, "id"),
                "name": _get(block, "name"),
                "input": {},
            }
            self._json[index] = ""
            self.forwarded = True
        elif kind == "server_tool_use":
            # Kept whole, its input filled as it streams. Once it streams the API has run (and
            # charged) the tool: a retry would run it again, so it counts as forwarded.
            self.blocks[index] = {**_plain(block), "input": {}}
            self._json[index] = ""
            self.forwarded = True
        elif isinstance(kind, str):
            # A block given whole (a server tool's result, a type newer than this code): kept
            # verbatim, since the API wants it back as it sent it.
            self.blocks[index] = dict(_plain(block))
        else:
            return  # not a block at all: nothing to keep
        if self.blocks[index].get("text"):
            self.forwarded = True

    def _delta(self, index: int, delta: Any) -> None:
        block = self.blocks.get(index)
        if block is None:
            return
        kind = _get(delta, "type")
        if kind == "text_delta":
            text = _get(delta, "text") or ""
            block["text"] = block.get("text", "") + text
            self.forwarded = self.forwarded or bool(text)
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + (_get(delta, "thinking") or "")
            self.forwarded = True
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + (_get(delta, "signature") or "")
        elif kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + (_get(delta, "partial_json") or "")
            self.forwarded = True
        elif kind == "citations_delta" and block["type"] == "text":
            # One more source for the text so far; the model is sent its citations back.
            cited = block.get("citations") or []
            block["citations"] = [*cited, _plain(_get(delta, "citation"))]

    def _stop(self, index: int) -> None:
        block = self.blocks.get(index)
        if block is not None and block["type"] in _STREAMED_INPUT:
            raw = self._json.get(index, "")
            try:
                parsed = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict):
                block["input"] = parsed
            else:
                self._unparsed.add(index)
        self._closed.add(index)

    def _cut_indices(self) -> list[int]:
        return [
            i
            for i, block in self.blocks.items()
            if block["type"] in _STREAMED_INPUT and (i not in self._closed or i in self._unparsed)
        ]

    def cut_calls(self) -> set[str]:
        """The tool calls whose input never completed: the block never stopped (the answer ran
        out at max_tokens) or its JSON is not an object. They must not run (`_loop`)."""
        cut = (self.blocks[i] for i in self._cut_indices())
        return {str(block["id"]) for block in cut if block["type"] == "tool_use"}

    def message(self) -> dict[str, Any]:
        """The whole answer; a cut-off call keeps what streamed of its input, never `{}`."""
        for i in self._cut_indices():
            self.blocks[i]["input"] = {PARTIAL_INPUT: self._json.get(i, "")}
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
            return index in self._closed and index not in self._unparsed
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
