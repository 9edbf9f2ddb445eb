"""Where a Session sits in its tree, and what that allows: derived by the operator, never read.

A child Session's depth, the turns it may take and the budget it may spend come from walking
`spec.parentRef` up to the root through the API server (each parent's uid checked when the ref
names one), and from the Agents and statuses met on the way. Nothing a Session says about
itself (labels, annotations, its own spec) can raise them, so a Session created by hand with a
`parentRef` gets no more than a child the custodian started. The one annotation read,
`corral.dev/max-turns` (what the parent's model asked for its child), can only lower the cap.

Pure: the session loop gathers the chain and the Agents, this module decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from corral_api.kinds import MAX_DEPTH_CAP, AgentSpec, Budget, SessionSpec, Usage

from ..budgets import lowest, remainder
from . import reasons as R

# What the parent's custodian asked for its child; honoured only as a further limit.
MAX_TURNS_ANNOTATION = "corral.dev/max-turns"


@dataclass(frozen=True)
class Lineage:
    """What the operator derived for one Session from its parent chain."""

    depth: int  # 0 for a top-level Session
    max_turns: int  # turns it may have in all: those settled plus those left
    budget: Budget  # the lowest of its own, its Agent's and its parent's remainder
    root: str  # the top-level Session's name (itself for a top-level Session)


@dataclass(frozen=True)
class LineageRefusal:
    """The chain forbids the Session (`hold` False: it fails) or cannot be judged yet."""

    reason: str
    message: str
    hold: bool = False


Outcome = Lineage | LineageRefusal


# ------------------------------------------------------------------------------- budgets


def budget_above_agent(session: Budget | None, agent: Budget | None) -> str | None:
    """Why a Session's budget is not allowed by its Agent's (it may only lower it), or None."""
    if session is None or agent is None:
        return None
    if session.tokens is not None and agent.tokens is not None and session.tokens > agent.tokens:
        return (
            f"spec.budget.tokens {session.tokens} is above its Agent's limits.budget.tokens "
            f"{agent.tokens}; a Session may only lower its Agent's budget"
        )
    if (
        session.cost_usd is not None
        and agent.cost_usd is not None
        and session.cost_usd > agent.cost_usd
    ):
        return (
            f"spec.budget.costUSD {session.cost_usd:g} is above its Agent's "
            f"limits.budget.costUSD {agent.cost_usd:g}; a Session may only lower its Agent's "
            "budget"
        )
    return None


def spent_axis(budget: Budget) -> str | None:
    """The axis of an effective budget with nothing left to spend, or None."""
    if budget.tokens is not None and budget.tokens < 1:
        return "tokens"
    if budget.cost_usd is not None and budget.cost_usd <= 0:
        return "costUSD"
    return None


# ------------------------------------------------------------------------------- the chain


@dataclass(frozen=True)
class _Node:
    name: str
    uid: str
    spec: SessionSpec
    turns: int
    usage: Usage
    annotations: dict[str, Any]


def _node(body: dict[str, Any]) -> _Node | None:
    md = body.get("metadata") or {}
    status = body.get("status") or {}
    try:
        spec = SessionSpec.model_validate(body.get("spec") or {})
        usage = Usage.model_validate(status.get("usage") or {})
    except ValidationError:
        return None
    turns = status.get("turns")
    return _Node(
        name=str(md.get("name", "")),
        uid=str(md.get("uid", "")),
        spec=spec,
        turns=turns if isinstance(turns, int) and turns >= 0 else 0,
        usage=usage,
        annotations=dict(md.get("annotations") or {}),
    )


def _asked_turns(annotations: dict[str, Any]) -> int | None:
    raw = annotations.get(MAX_TURNS_ANNOTATION)
    try:
        value = int(str(raw))
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None


def _agent_spec(body: dict[str, Any] | None) -> AgentSpec | None:
    if body is None:
        return None
    try:
        return AgentSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return None


def _invalid(message: str) -> LineageRefusal:
    return LineageRefusal(R.INVALID_SPEC, message)


def derive_lineage(
    session: dict[str, Any],
    agent: AgentSpec,
    parents: list[dict[str, Any]],
    agents: dict[str, dict[str, Any] | None],
) -> Outcome:
    """The Session's depth, turn cap and budget, or why its chain forbids it.

    `session` is the Session's body and `agent` its own Agent's spec. `parents` are the
    Sessions met walking `parentRef` up from it, nearest first, as far as they were found;
    `agents` are the Agent bodies those parents name (None: not found).
    """
    me = _node(session)
    if me is None:
        return _invalid("the Session's spec or status does not parse")
    chain: list[_Node] = []
    seen = {me.uid}
    ref = me.spec.parent_ref
    where = "spec.parentRef"
    while ref is not None:
        if len(chain) >= MAX_DEPTH_CAP:
            return _invalid(
                f"{where}: the Session would be deeper than {MAX_DEPTH_CAP}, the cap no Agent "
                "can raise"
            )
        found = parents[len(chain)] if len(chain) < len(parents) else None
        if found is None or (found.get("metadata") or {}).get("name") != ref.name:
            return _invalid(f"{where}: Session {ref.name!r} is not found in this namespace")
        parent = _node(found)
        if parent is None:
            return _invalid(f"{where}: Session {ref.name!r} has a spec that does not parse")
        if ref.uid is not None and ref.uid != parent.uid:
            return _invalid(
                f"{where}.uid {ref.uid!r} does not match Session {ref.name!r} (uid "
                f"{parent.uid!r}): the parent it named is gone"
            )
        if parent.uid in seen:
            return _invalid(f"{where}: the parent chain loops back to Session {ref.name!r}")
        seen.add(parent.uid)
        chain.append(parent)
        where = f"the parentRef of Session {parent.name!r}"
        ref = parent.spec.parent_ref

    if not chain:
        return Lineage(
            depth=0,
            max_turns=agent.limits.max_turns,
            budget=lowest(me.spec.budget, agent.limits.budget),
            root=me.name,
        )

    specs: list[AgentSpec] = []
    for node in chain:
        found_agent = _agent_spec(agents.get(node.spec.agent_ref))
        if found_agent is None:
            return LineageRefusal(
                R.AGENT_NOT_FOUND,
                f"Agent {node.spec.agent_ref!r} of the ancestor Session {node.name!r} is not "
                "found or not valid; the Session's limits cannot be derived without it",
                hold=True,
            )
        specs.append(found_agent)

    parent, parent_agent = chain[0], specs[0]
    if not parent_agent.orchestrator:
        return _invalid(
            f"spec.parentRef: Session {parent.name!r} runs Agent {parent.spec.agent_ref!r}, "
            "which is not an orchestrator; only orchestrators may start children"
        )
    own_ref = me.spec.agent_ref
    if own_ref != parent.spec.agent_ref and own_ref not in parent_agent.children.agents:
        return _invalid(
            f"spec.agentRef: Agent {own_ref!r} is not allowed for a child of Session "
            f"{parent.name!r}: its Agent {parent.spec.agent_ref!r} lists "
            f"{list(parent_agent.children.agents) or 'no other Agents'} in children.agents"
        )
    root, root_agent = chain[-1], specs[-1]
    depth = len(chain)
    max_depth = min(root_agent.limits.max_depth, MAX_DEPTH_CAP)
    if depth > max_depth:
        return _invalid(
            f"spec.parentRef: the Session would be at depth {depth}, beyond the limit of "
            f"{max_depth} set by the root Session {root.name!r}'s Agent "
            f"{root.spec.agent_ref!r} (limits.maxDepth)"
        )

    # Top-down from the root: each level's turns left and budget left bound the next.
    turns_left: int | None = None
    budget_left: Budget | None = None
    for index, (node, spec) in enumerate(zip(reversed(chain), reversed(specs), strict=True)):
        is_root = index == 0
        total = _turn_cap(spec, node, turns_left, is_child=not is_root)
        turns_left = max(0, total - node.turns)
        budget_left = remainder(
            lowest(node.spec.budget, spec.limits.budget, budget_left), node.usage
        )
    return Lineage(
        depth=depth,
        max_turns=_turn_cap(agent, me, turns_left, is_child=True),
        budget=lowest(me.spec.budget, agent.limits.budget, budget_left),
        root=root.name,
    )


def with_turn_cap(spec: AgentSpec, max_turns: int) -> AgentSpec:
    """The Agent's spec with the turn limit derived here (never above the Agent's): what the
    session's driver and custodian are given (the operator's and `corral run`'s alike)."""
    cap = min(spec.limits.max_turns, max_turns)
    return spec.model_copy(update={"limits": spec.limits.model_copy(update={"max_turns": cap})})


def out_of_turns_message(turns: int, max_turns: int) -> str:
    """Why a session with no turn left fails (reason TurnLimitReached)."""
    if max_turns > 0:
        return f"no turn left: {turns} of {max_turns} used"
    return "no turn left: the parent session has none left to give"


def _turn_cap(spec: AgentSpec, node: _Node, parent_left: int | None, *, is_child: bool) -> int:
    """Turns a Session may have in all: its Agent's limit, and for a child no more than it has
    settled plus what its parent has left now (the parent's turn in flight counts as left)."""
    cap = spec.limits.max_turns
    if is_child:
        asked = _asked_turns(node.annotations)
        if asked is not None:
            cap = min(cap, asked)
    if parent_left is not None:
        cap = min(cap, node.turns + parent_left)
    return cap
