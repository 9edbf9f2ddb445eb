"""The Menu: this turn's control tools, computed afresh from the Agent spec and session state.

The harness reads the Menu at the start of every submission and shows each tool to the model
as `mcp__corral__<name>`. Showing a tool is a courtesy; invoking one is checked again by the
rules, because a caller can call the custodian without asking the Menu first.

The Agent's `tools.allow` / `tools.deny` and the fixed rule apply here exactly as in the harness
(ADR 0005, `corral_common.toolmatch`): the tool `push` is matched as both `mcp__corral__push`
and `push`, so `mcp__corral__push`, `mcp__corral__*`, `push` or `*` allow it, and a deny
pattern matching either form refuses it. Default deny: an Agent whose allowlist names no Menu
tool gets an empty Menu and every Menu call refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral_common import toolmatch

from .facts import SessionFacts


@dataclass(frozen=True)
class MenuTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    pick: bool = False  # a call whose answer can end the turn
    needs_cluster: bool = True

    def wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "pick": self.pick,
        }


def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


_STR = {"type": "string"}
_SHA = {"type": "string", "pattern": "^[0-9a-f]{40}$"}

SPAWN_CHILD = MenuTool(
    "spawn_child",
    "Start a child session with its own sandbox on a sub-task.",
    _obj(
        {
            "task": {"type": "string", "description": "What the child should do."},
            "agent": {"type": "string", "description": "Agent to run; default this one."},
            "maxTurns": {"type": "integer", "minimum": 1, "description": "At most yours left."},
            "readOnly": {"type": "boolean"},
            "criteria": {"type": "string", "description": "Text the child's answer must hold."},
            "budget": {
                "type": "object",
                "description": "The part of this session's remaining budget the child gets "
                "(default: half of what remains); it counts against this session from now on.",
                "properties": {
                    "tokens": {"type": "integer", "minimum": 1},
                    "costUSD": {"type": "number", "exclusiveMinimum": 0},
                },
                "additionalProperties": False,
            },
        },
        ("task",),
    ),
)
CHILD_STATUS = MenuTool(
    "child_status",
    "Show one child session's phase, turns and last result.",
    _obj({"name": _STR}, ("name",)),
)
WALK_TREE = MenuTool("walk_tree", "List every session below this one, as a tree.", _obj({}))
WAIT_CHILDREN = MenuTool(
    "wait_children",
    "Wait for children: all (default), first, quorum, or supervise (stop on a failure).",
    _obj(
        {
            "mode": {"type": "string", "enum": ["all", "first", "quorum", "supervise"]},
            "quorum": {"type": "integer", "minimum": 1},
            "children": {"type": "array", "items": _STR},
        }
    ),
    pick=True,
)
REQUEST_APPROVAL = MenuTool(
    "request_approval",
    "Ask a human to approve one exact tool call before it runs.",
    _obj(
        {"tool": _STR, "arguments": {"type": "object"}, "reason": _STR},
        ("tool",),
    ),
    pick=True,  # the turn ends; the session waits for the human
)
PUSH = MenuTool(
    "push",
    "Push the workspace's HEAD to this session's own branch (fast-forward only).",
    _obj({"branch": _STR}),
    needs_cluster=False,
)
LAND = MenuTool(
    "land",
    "Land a revision on a target branch; needs a human's approval and passing evidence.",
    _obj({"target": _STR, "revision": _SHA}, ("target", "revision")),
    pick=True,  # without a decision yet, the turn ends and the session waits for it
)

# The children's tools: with a cluster, or in `corral run`'s session tree.
TREE_TOOLS = frozenset({"spawn_child", "child_status", "walk_tree", "wait_children"})

ALL_TOOLS: dict[str, MenuTool] = {
    t.name: t
    for t in (SPAWN_CHILD, CHILD_STATUS, WALK_TREE, WAIT_CHILDREN, REQUEST_APPROVAL, PUSH, LAND)
}


def why_not_offered(facts: SessionFacts, name: str, *, gate: bool = False) -> str | None:
    """None when the tool is on this session's Menu now, else the reason it is not.

    `gate`: the harness's approval gate is asking for a human's decision on a call its policy
    answered `ask`; that call passed the allowlist already, and an Approval decides nothing by
    itself, so request_approval is not held to the allowlist then (the fixed rule still holds).
    """
    tool = ALL_TOOLS.get(name)
    if tool is None:
        return f"there is no control tool named {name!r}"
    shown = toolmatch.menu_name(name)
    if gate and name == "request_approval":
        refused = toolmatch.forbidden_reason(shown)
    else:
        refused = toolmatch.refusal(shown, facts.agent.tools.allow, facts.agent.tools.deny)
    if refused is not None:
        return refused
    if tool.needs_cluster and not facts.cluster and not (facts.local_tree and name in TREE_TOOLS):
        return f"{name} needs the cluster, and this custodian has none configured"
    if name in TREE_TOOLS:
        if not facts.agent.orchestrator:
            return f"{name} is for orchestrator agents only"
        if name == "spawn_child" and facts.depth + 1 > facts.max_depth:
            return (
                f"a child would be at depth {facts.depth + 1}, beyond this tree's limit of "
                f"{facts.max_depth}"
            )
        if name == "spawn_child" and facts.remaining_turns < 1:
            return "this session has no turns left to give a child"
    if name in ("push", "land"):
        if facts.read_only:
            return f"a read-only session cannot {name}"
        if not facts.branch:
            return f"this session has no branch, so it cannot {name}"
    return None


def menu(facts: SessionFacts) -> list[MenuTool]:
    return [t for name, t in ALL_TOOLS.items() if why_not_offered(facts, name) is None]
