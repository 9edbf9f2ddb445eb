"""Prompt-cache breakpoints: where each request's stable prefixes end (docs/performance.md).

The Messages API caches a request's prefix (tools, then system, then messages) up to a block
marked `cache_control`; a later request that starts with the same prefix reads it back at a
tenth of the input price, and the write costs 1.25 times. A turn's requests repeat their front:
the tool list, the Agent's identity and the instruction files stay the same step after step, and
each request's conversation is the last one's plus one step. So every request marks, within the
API's four breakpoints:

- the last tool: the tool list;
- each leading part of the system prompt the policy names stable (the identity, the
  instruction files), sent as a text block of its own; the rest of the prompt (the workspace,
  the rules, the task, this call's lines) is one unmarked block after them;
- the last block of the conversation: the next request finds it again (the provider looks for a
  written prefix up to 20 blocks before a marked one), so a step pays only for its own blocks.

Markers go on copies: the blocks of the transcript are shared with the request and stay as they
are. `CORRAL_CACHE_BREAKPOINTS=0` sends none (bench/cache_bench.py compares the two).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

MAX_BREAKPOINTS: Final = 4  # the API refuses a request with more
# Blocks the API lets carry a marker: a thinking block may not.
_MARKABLE: Final = frozenset({"text", "image", "document", "tool_use", "tool_result"})
_SEPARATOR: Final = "\n\n"  # between the sections of an assembled system prompt


def ephemeral() -> dict[str, str]:
    """The marker: the default 5-minute cache (the custodian allows no other)."""
    return {"type": "ephemeral"}


def _marked(block: dict[str, Any]) -> dict[str, Any]:
    return {**block, "cache_control": ephemeral()}


def marked_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool list with its last tool marked: the list is one stable prefix."""
    if not tools:
        return tools
    return [*tools[:-1], _marked(tools[-1])]


def system_blocks(system: str, stable: Sequence[str], marks: int) -> str | list[dict[str, Any]]:
    """The system prompt as text blocks: each of its first `marks` stable leading parts marked,
    then the rest unmarked. The string as it is when the parts do not lead it (a hook replaced
    the prompt) or there is nothing to mark."""
    parts = [part for part in stable if part][: max(marks, 0)]
    lead = _SEPARATOR.join(parts)
    if not parts or not (system == lead or system.startswith(lead + _SEPARATOR)):
        return system
    rest = system[len(lead) + len(_SEPARATOR) :]
    blocks = [_marked({"type": "text", "text": part}) for part in parts]
    if rest:
        blocks.append({"type": "text", "text": rest})
    return blocks


def marked_conversation(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The messages with the last markable block of the last one marked; None when it has none
    (the conversation then takes no breakpoint) or is the model's own answer sent back to go on
    (`pause_turn`), which goes back as it came."""
    if not messages or messages[-1].get("role") != "user":
        return None
    last = messages[-1]
    content = last.get("content")
    if isinstance(content, str):
        if not content:
            return None
        blocks: list[dict[str, Any]] = [{"type": "text", "text": content}]
    else:
        blocks = list(content or [])
    for index in range(len(blocks) - 1, -1, -1):
        block = blocks[index]
        if block.get("type") in _MARKABLE and not _empty_text(block):
            blocks[index] = _marked(block)
            return [*messages[:-1], {**last, "content": blocks}]
    return None


def _empty_text(block: dict[str, Any]) -> bool:
    return block.get("type") == "text" and not block.get("text")  # the API refuses to mark it


def with_breakpoints(params: dict[str, Any], stable_system: Sequence[str]) -> dict[str, Any]:
    """A request body with its stable prefixes marked: the tool list, the stable parts of the
    system prompt and the conversation so far, never more than the API's four markers."""
    marked = dict(params)
    used = 0
    if params.get("tools"):
        marked["tools"] = marked_tools(params["tools"])
        used += 1
    conversation = marked_conversation(params.get("messages") or [])
    if conversation is not None:
        marked["messages"] = conversation
        used += 1
    if isinstance(params.get("system"), str):
        marked["system"] = system_blocks(params["system"], stable_system, MAX_BREAKPOINTS - used)
    return marked
