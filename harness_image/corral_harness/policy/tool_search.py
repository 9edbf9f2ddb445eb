"""The tool-search tool: the model fetches a tool's longer instructions only when it asks.

The turn executes it like any working tool: when the model calls `tool_search`, pass the call's
input and the step's visible tools to `answer_tool_search` and send back the string it returns
as the tool result (`is_error` when it starts with "error:").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..ports import ToolSpec

TOOL_SEARCH_NAME = "tool_search"

TOOL_SEARCH = ToolSpec(
    name=TOOL_SEARCH_NAME,
    description="Fetch the full instructions of a listed tool, or search tools by keyword.",
    input_schema={
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "Exact tool name to explain."},
            "query": {"type": "string", "description": "Keywords to search names and texts."},
        },
        "additionalProperties": False,
    },
    kind="working",
    instructions=(
        "Give `name` to read one tool's full instructions, or `query` to list tools whose "
        "name or description mentions every keyword. Only tools on your current list appear."
    ),
)


def _doc(spec: ToolSpec) -> str:
    body = spec.instructions or spec.description
    return f"# {spec.name}\n{spec.description}\n\n{body}"


def answer_tool_search(tool_input: dict[str, Any], visible: Sequence[ToolSpec]) -> str:
    name = tool_input.get("name")
    query = tool_input.get("query")
    by_name = {t.name: t for t in visible}
    if isinstance(name, str) and name:
        spec = by_name.get(name)
        if spec is None:
            return f"error: no tool named {name!r} is on your list"
        return _doc(spec)
    if isinstance(query, str) and query.strip():
        words = query.lower().split()
        hits = [
            t
            for t in visible
            if all(w in f"{t.name} {t.description} {t.instructions}".lower() for w in words)
        ]
        if not hits:
            return f"no tool on your list matches {query!r}"
        return "\n".join(f"{t.name}: {t.description}" for t in hits)
    return "error: give `name` (a tool on your list) or `query` (keywords)"
