"""What a model request may ask for, as pure functions over the parsed body and the facts.

The caller is not trusted: it may name any model, any max_tokens, server-side tools that reach
the network from the provider's side (past the pod's egress policy) or an MCP connector. The
custodian lets through only the Agent's model and the Session's override, clamps max_tokens to
min(the Agent's limits.maxOutputTokens, the catalog's maximum for the model), keeps a thinking
budget below it, and refuses the rest with a reason the model can read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .facts import SessionFacts
from .prices import price_for

# Body fields that make the provider act on the caller's behalf beyond generating text.
_REFUSED_FIELDS = ("mcp_servers", "container")
MIN_THINKING_BUDGET = 1024


@dataclass(frozen=True)
class ModelRefusal:
    status: int
    kind: str  # the Anthropic error type
    message: str


@dataclass(frozen=True)
class CheckedRequest:
    body: dict[str, Any]
    model: str
    max_tokens: int
    changed: bool  # the body differs from what the caller sent


def output_limit(facts: SessionFacts, model: str) -> int:
    """min(the Agent's maxOutputTokens (itself under the hard cap), the catalog's maximum)."""
    info = price_for(model)
    limit = facts.max_output_tokens
    return min(limit, info.max_output_tokens) if info is not None else limit


def check_request(facts: SessionFacts, body: dict[str, Any]) -> CheckedRequest | ModelRefusal:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return ModelRefusal(400, "invalid_request_error", "'model' must name a model")
    allowed = facts.allowed_models
    if model not in allowed:
        return ModelRefusal(
            403,
            "permission_error",
            f"model {model!r} is not allowed for this session; allowed: "
            + ", ".join(repr(m) for m in allowed)
            + " (the Agent's model and the Session's spec.overrides.model)",
        )
    if facts.budget.cost is not None and price_for(model) is None:
        return ModelRefusal(
            400,
            "invalid_request_error",
            f"model {model!r} has no price in the catalog, so it cannot be held to this "
            "session's cost budget",
        )
    for field in _REFUSED_FIELDS:
        if field in body:
            return ModelRefusal(
                400, "invalid_request_error", f"'{field}' is not allowed through the custodian"
            )
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return ModelRefusal(400, "invalid_request_error", "'tools' must be a list")
        for tool in tools:
            kind = tool.get("type", "custom") if isinstance(tool, dict) else None
            if kind not in (None, "custom"):
                return ModelRefusal(
                    400,
                    "invalid_request_error",
                    f"server tool {kind!r} is not allowed: only tools the harness runs may be "
                    "offered to the model",
                )
    requested = body.get("max_tokens")
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        return ModelRefusal(400, "invalid_request_error", "'max_tokens' must be a positive integer")
    limit = output_limit(facts, model)
    if requested <= limit:
        return CheckedRequest(body, model, requested, changed=False)
    clamped = dict(body, max_tokens=limit)
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and budget >= limit:
            # The provider needs budget_tokens < max_tokens, and at least 1024 of it.
            if limit - 1 >= MIN_THINKING_BUDGET:
                clamped["thinking"] = dict(thinking, budget_tokens=limit - 1)
            else:
                clamped["thinking"] = {"type": "disabled"}
    return CheckedRequest(clamped, model, limit, changed=True)
