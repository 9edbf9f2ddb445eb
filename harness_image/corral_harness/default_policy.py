"""The minimal turn policy: what the harness does when no richer policy is plugged in.

All catalog tools are visible; a working tool runs when a `tools.allow` pattern of the Agent
matches it and no `tools.deny` pattern does (deny wins, even under `*`); Menu tools are the
custodian's to police and always run; the system prompt is the Agent's identity and its
instructions; every finished turn is accepted. The full policy (context layers, permissions,
hooks, memory) lives in `corral_harness.policy` and plugs in through the same `TurnPolicy`.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from .ports import ModelRequestPlan, ToolCall, ToolDecision, ToolSpec, TurnContext, TurnVerdict


def tool_allowed(name: str, allow: list[str], deny: list[str]) -> bool:
    if any(fnmatchcase(name, pattern) for pattern in deny):
        return False
    return any(fnmatchcase(name, pattern) for pattern in allow)


class DefaultPolicy:
    def __init__(self) -> None:
        self._kinds: dict[str, str] = {}

    def visible_tools(self, ctx: TurnContext, catalog: list[ToolSpec]) -> list[ToolSpec]:
        self._kinds = {spec.name: spec.kind for spec in catalog}
        return list(catalog)

    async def decide_tool(self, ctx: TurnContext, call: ToolCall) -> ToolDecision:
        if self._kinds.get(call.name) == "menu":
            return ToolDecision("allow")
        tools = ctx.agent.tools
        if tool_allowed(call.name, tools.allow, tools.deny):
            return ToolDecision("allow")
        return ToolDecision("deny", f"the agent's tool policy does not allow {call.name!r}")

    async def prepare_request(
        self, ctx: TurnContext, transcript: list[dict[str, Any]]
    ) -> ModelRequestPlan:
        system = ctx.agent.identity
        if ctx.agent.instructions:
            system = f"{system}\n\n{ctx.agent.instructions}"
        # Both come from the Agent and stay the same call after call: each a cached prefix.
        stable = tuple(part for part in (ctx.agent.identity, ctx.agent.instructions) if part)
        return ModelRequestPlan(system=system, messages=transcript, stable_system=stable)

    async def after_tool(
        self, ctx: TurnContext, call: ToolCall, result: str, is_error: bool
    ) -> None:
        return None

    async def after_turn(self, ctx: TurnContext, final_text: str) -> TurnVerdict:
        return TurnVerdict(accept=True)
