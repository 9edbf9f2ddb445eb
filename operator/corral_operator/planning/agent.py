"""The Agent planner: validate the definition beyond its schema and say whether it is Ready.

The CRD's OpenAPI and CEL rules refuse most bad specs at the API server; this catches what
they cannot state and what an older CRD may have let through, so the status carries a reason.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from corral_api.kinds import Agent, AgentSpec, AgentStatus

from .conditions import set_condition

# Patterns that can only hide real mistakes: a deny of everything leaves the agent no tools.
_EVERYTHING = {"*", "**"}


@dataclass(frozen=True)
class AgentPlan:
    status: dict[str, Any]
    changed: bool
    ready: bool
    reason: str
    message: str


def validate_agent_spec(raw_spec: dict[str, Any]) -> tuple[AgentSpec | None, list[str]]:
    """The spec parsed, or the problems found, each a sentence a person can act on."""
    try:
        spec = AgentSpec.model_validate(raw_spec)
    except ValidationError as exc:
        return None, [
            f"spec.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        ]
    problems: list[str] = []
    if set(spec.tools.deny) & _EVERYTHING and spec.tools.allow:
        problems.append("tools.deny has '*', which refuses every tool tools.allow names")
    for pattern in spec.tools.allow:
        for deny in spec.tools.deny:
            if pattern == deny:
                problems.append(f"tool pattern {pattern!r} is in both tools.allow and tools.deny")
    if spec.limits.max_depth != 3 and not spec.orchestrator:
        problems.append("limits.maxDepth only applies to orchestrators; set orchestrator: true")
    for rule in spec.sandbox.egress:
        if rule.cidr is not None and not _is_cidr(rule.cidr):
            problems.append(f"sandbox.egress cidr {rule.cidr!r} is not a CIDR")
    if spec.sandbox.image is not None and not spec.sandbox.image.strip():
        problems.append("sandbox.image is empty")
    return (spec if not problems else None), problems


def _is_cidr(value: str) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return "/" in value


def plan_agent(body: dict[str, Any], now: str) -> AgentPlan:
    """Validate and compute the Agent's status; `changed` says whether to patch it."""
    generation = int(body.get("metadata", {}).get("generation") or 0)
    old = AgentStatus.model_validate(body.get("status") or {})
    _, problems = validate_agent_spec(body.get("spec") or {})
    if problems:
        ready, reason, message = False, "InvalidSpec", "; ".join(problems)
    else:
        ready, reason, message = True, "Validated", "the definition is valid"
    conditions = set_condition(
        old.conditions,
        "Ready",
        "True" if ready else "False",
        reason,
        message,
        now=now,
        generation=generation,
    )
    new = AgentStatus(conditions=conditions, observed_generation=generation)
    status = new.wire()
    return AgentPlan(status, status != old.wire(), ready, reason, message)


def agent_ready(agent: Agent | dict[str, Any] | None) -> bool:
    """Whether an observed Agent carries Ready=True for its current generation."""
    if agent is None:
        return False
    body = agent.wire() if isinstance(agent, Agent) else agent
    generation = int(body.get("metadata", {}).get("generation") or 0)
    for cond in (body.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(
                cond.get("status") == "True"
                and int(cond.get("observedGeneration") or 0) >= generation
            )
    return False


def usable_spec(agent: dict[str, Any] | None) -> AgentSpec | None:
    """The spec a Session's next submission may use: the Agent's, when its Ready condition
    says it is valid for this generation, or when no verdict on this generation is out yet
    and the check the Agent's handler runs finds nothing wrong (so a changed Agent reaches the
    next submission without waiting for that handler's pass). None for an invalid Agent: the
    Session keeps the last valid spec."""
    if agent is None:
        return None
    generation = int(agent.get("metadata", {}).get("generation") or 0)
    conditions = (agent.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    judged = ready is not None and int(ready.get("observedGeneration") or 0) >= generation
    if judged and ready is not None and ready.get("status") != "True":
        return None
    spec, _ = validate_agent_spec(agent.get("spec") or {})
    return spec
