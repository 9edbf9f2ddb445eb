"""The script format of the scripted model (see the package docstring): loading and matching."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ScriptError(ValueError):
    pass


@dataclass
class Fault:
    status: int | None = None  # HTTP error before any content
    error_type: str = "api_error"
    message: str = "scripted fault"
    error_event: bool = False  # an `error` event inside the 200 stream
    after_blocks: int = 0  # blocks streamed before the error / silence / truncation
    silence: float = 0.0  # seconds of silence after `after_blocks` blocks
    truncate: bool = False  # close the stream after `after_blocks` blocks, no message_stop


@dataclass
class Reply:
    content: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    fault: Fault | None = None
    delay: float = 0.0  # seconds before the response starts
    event_delay: float = 0.0  # seconds between stream events (a slow stream)
    when: dict[str, str] = field(default_factory=dict)
    otherwise: Reply | None = None

    def final_stop_reason(self) -> str:
        if self.stop_reason:
            return self.stop_reason
        return "tool_use" if any(b["type"] == "tool_use" for b in self.content) else "end_turn"


@dataclass
class Script:
    default: list[Reply] = field(default_factory=list)
    conversations: dict[str, list[Reply]] = field(default_factory=dict)

    def replies_for(self, conversation: str) -> list[Reply]:
        """The conversation's own replies; else those of the first key that is a glob pattern
        matching it (`boss-child-?????`: a child Session's generated name); else the default.
        Each conversation still keeps its own place in the replies."""
        found = self.conversations.get(conversation)
        if found is not None:
            return found
        for key, replies in self.conversations.items():
            if any(c in key for c in "*?[") and fnmatch.fnmatchcase(conversation, key):
                return replies
        return self.default


def load_script(path: str | Path) -> Script:
    text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    return parse_script(data or {})


def parse_script(data: Any) -> Script:
    if isinstance(data, list):
        return Script(default=_replies(data, "default"))
    if not isinstance(data, dict):
        raise ScriptError("a script is a mapping {default, conversations} or a list of replies")
    unknown = set(data) - {"default", "conversations"}
    if unknown:
        raise ScriptError(f"unknown script keys: {sorted(unknown)}")
    convs = data.get("conversations") or {}
    if not isinstance(convs, dict):
        raise ScriptError("conversations must map a conversation id to a list of replies")
    return Script(
        default=_replies(data.get("default") or [], "default"),
        conversations={str(k): _replies(v, f"conversations.{k}") for k, v in convs.items()},
    )


def _replies(items: Any, where: str) -> list[Reply]:
    if not isinstance(items, list):
        raise ScriptError(f"{where} must be a list of replies")
    out: list[Reply] = []
    for i, item in enumerate(items):
        reply = parse_reply(item, f"{where}[{i}]")
        repeat = int(item.get("repeat", 1)) if isinstance(item, dict) else 1
        out.extend([reply] * max(1, repeat))
    return out


_REPLY_KEYS = {
    "content",
    "text",
    "thinking",
    "tool_use",
    "tool_uses",
    "stop_reason",
    "usage",
    "fault",
    "delay",
    "event_delay",
    "when",
    "otherwise",
    "repeat",
    # The scheduler's side calls (docs/turns.md): shorthands for their tool calls.
    "classify",
    "plan",
    "plan_edit",
}


# shorthand key -> (the harness's tool name, how the value becomes its input)
def _as_input(value: Any) -> dict[str, Any]:
    return dict(value)


def _as_plan(value: Any) -> dict[str, Any]:
    return {"steps": list(value)} if isinstance(value, list) else dict(value)


_SHORTHANDS: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
    "classify": ("classify", _as_input),
    "plan": ("plan_open", _as_plan),
    "plan_edit": ("plan_edit_step", _as_input),
}


def parse_reply(item: Any, where: str) -> Reply:
    if isinstance(item, str):
        item = {"text": item}
    if not isinstance(item, dict):
        raise ScriptError(f"{where}: a reply is a mapping or a string")
    unknown = set(item) - _REPLY_KEYS
    if unknown:
        raise ScriptError(f"{where}: unknown reply keys {sorted(unknown)}")
    content: list[dict[str, Any]] = [_block(b, where) for b in item.get("content") or []]
    if "thinking" in item:
        content.append({"type": "thinking", "thinking": str(item["thinking"])})
    if "text" in item:
        content.append({"type": "text", "text": str(item["text"])})
    uses = list(item.get("tool_uses") or [])
    if "tool_use" in item:
        uses.append(item["tool_use"])
    for key, (tool, make_input) in _SHORTHANDS.items():
        if key in item:
            if not isinstance(item[key], dict | list):
                raise ScriptError(f"{where}: {key} is a mapping (or, for plan, a list of steps)")
            uses.append({"name": tool, "input": make_input(item[key])})
    content.extend(_block({"type": "tool_use", **u}, where) for u in uses)
    return Reply(
        content=content,
        stop_reason=item.get("stop_reason"),
        usage={str(k): int(v) for k, v in (item.get("usage") or {}).items()},
        fault=_fault(item["fault"], where) if "fault" in item else None,
        delay=float(item.get("delay", 0)),
        event_delay=float(item.get("event_delay", 0)),
        when={str(k): str(v) for k, v in (item.get("when") or {}).items()},
        otherwise=parse_reply(item["otherwise"], f"{where}.otherwise")
        if "otherwise" in item
        else None,
    )


def _block(block: Any, where: str) -> dict[str, Any]:
    if not isinstance(block, dict) or block.get("type") not in ("text", "thinking", "tool_use"):
        raise ScriptError(f"{where}: a content block is text, thinking or tool_use")
    if block["type"] == "tool_use":
        if not isinstance(block.get("name"), str):
            raise ScriptError(f"{where}: tool_use needs a name")
        return {
            "type": "tool_use",
            "name": block["name"],
            "input": block.get("input") or {},
            "id": block.get("id"),
        }
    return dict(block)


def _fault(data: Any, where: str) -> Fault:
    if not isinstance(data, dict):
        raise ScriptError(f"{where}: fault must be a mapping")
    fault = Fault(
        status=int(data["status"]) if "status" in data else None,
        error_type=str(data.get("type", "api_error")),
        message=str(data.get("message", "scripted fault")),
        error_event=bool(data.get("error_event", False)),
        after_blocks=int(data.get("after_blocks", 0)),
        silence=float(data.get("silence", 0)),
        truncate=bool(data.get("truncate", False)),
    )
    if fault.status is None and not (fault.error_event or fault.silence or fault.truncate):
        raise ScriptError(f"{where}: a fault needs status, error_event, silence or truncate")
    return fault


# ------------------------------------------------------------------------------------ checks


def _last_user_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return [{"type": "text", "text": content}]
            return list(content or [])
    return []


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "".join(c.get("text", "") for c in content if isinstance(c, dict))
    return str(content or "")


def check_holds(when: dict[str, str], body: dict[str, Any]) -> str | None:
    """None when every condition holds for the request, else what failed."""
    blocks = _last_user_blocks(body)
    for key, want in when.items():
        if key == "tool_result_contains":
            got = " | ".join(_result_text(b) for b in blocks if b.get("type") == "tool_result")
        elif key == "last_user_contains":
            got = " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        elif key == "system_contains":
            got = _system_text(body.get("system") or "")
        elif key == "tools_include":
            got = " ".join(t.get("name", "") for t in body.get("tools") or [])
            if want not in got.split():
                return f"tools_include {want!r}: tools were {got!r}"
            continue
        else:
            return f"unknown check {key!r}"
        if want not in got:
            return f"{key} {want!r}: got {got[:300]!r}"
    return None


def _system_text(system: Any) -> str:
    """The system prompt's text: a string, or its text blocks joined as the harness splits them
    (a prompt sent as blocks for the prompt cache reads as the string it was)."""
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n\n".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    return json.dumps(system)
