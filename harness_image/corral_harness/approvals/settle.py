"""Settling an `ask` through an ApprovalPort, and the digest a decision binds to.

The stores are elsewhere: Approval resources through the custodian in a pod, the custodian's
file store under `corral run` (both through `custodian_port`), and `corral_common.approval_files`
(through `file_port.FileApprovalPort`) where no custodian runs.
"""

from __future__ import annotations

from typing import Any

from corral_api.digest import action_digest

from ..ports import ApprovalPort, ToolCall, ToolDecision, TurnContext


def call_digest(name: str, arguments: dict[str, Any]) -> str:
    """The digest an Approval binds to (the same function the custodian uses)."""
    return action_digest(name, arguments)


async def settle_ask(
    decision: ToolDecision, ctx: TurnContext, call: ToolCall, port: ApprovalPort
) -> ToolDecision:
    """Turn an `ask` into allow or deny through a human; the same call (same input) replays."""
    if decision.outcome != "ask":
        return decision
    approval_id = await port.request(ctx, call, decision.reason)
    verdict = await port.wait(approval_id)
    if verdict == "approved":
        return ToolDecision("allow", f"approved by a human ({approval_id})", input=call.input)
    return ToolDecision("deny", f"denied by a human ({approval_id})")
