"""What the custodian knows about its own session when a rule is asked.

Built afresh for every model request, Menu read and tool call (from the environment, and from
the cluster when one is configured, through a cache of at most about a second), so an edited
Agent or a settled turn shows on the next call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corral_api.kinds import (
    MAX_CHILDREN_PER_TURN_CAP,
    MAX_DEPTH_CAP,
    MAX_OUTPUT_TOKENS_CAP,
    AgentSpec,
    LandingCheck,
)

from .budget import Budget, lowest


@dataclass(frozen=True)
class SessionFacts:
    name: str
    namespace: str
    uid: str
    agent: AgentSpec
    agent_ref: str | None = None
    depth: int = 0  # 0 for a top-level session, parent's depth + 1 for a child
    turns_used: int = 0  # settled turns, from the Session's status
    read_only: bool = False
    branch: str | None = None  # the one branch push may target
    # The Session's spec.workspace.ref: the branch it names is never the session branch.
    ref: str | None = None
    # Branches the ref was resolved to on the remote (its HEAD's branch), when the caller knows.
    ref_branches: tuple[str, ...] = ()
    cluster: bool = False  # a Kubernetes API server is configured
    # No cluster, but `corral run`'s session tree: the children's tools work there.
    local_tree: bool = False
    # The effective landing check: the Session's spec.landing.check, else the Agent's.
    land_check: LandingCheck | None = None
    repo: str | None = None  # the Session's spec.workspace.repo (Evidence is labelled by it)
    model_override: str | None = None  # the Session's spec.overrides.model
    # The Session's own cap (the operator's env and the live spec, the lowest of them).
    session_budget: Budget = field(default_factory=Budget)

    @property
    def max_depth(self) -> int:
        """The Agent's depth limit, never above the hard cap."""
        return min(self.agent.limits.max_depth, MAX_DEPTH_CAP)

    @property
    def session_branches(self) -> list[str]:
        """The Agent's spec.workspace.branches: the patterns the session branch must match."""
        return list(self.agent.workspace.branches)

    @property
    def land_targets(self) -> list[str] | None:
        """The Agent's spec.landing.targets; never the Session's (it cannot set them)."""
        return self.agent.landing.targets

    @property
    def max_children_per_turn(self) -> int:
        return min(self.agent.limits.max_children_per_turn, MAX_CHILDREN_PER_TURN_CAP)

    @property
    def remaining_turns(self) -> int:
        """Turns this session still has, counting the one in progress."""
        return max(0, self.agent.limits.max_turns - self.turns_used)

    @property
    def allowed_models(self) -> tuple[str, ...]:
        """The Agent's model, the Session's override and the scheduler's classifier model
        (docs/turns.md); nothing else goes upstream."""
        models = [self.agent.model]
        for extra in (self.model_override, self.agent.scheduler.classifier_model):
            if extra and extra not in models:
                models.append(extra)
        return tuple(models)

    @property
    def max_output_tokens(self) -> int:
        return min(self.agent.limits.max_output_tokens, MAX_OUTPUT_TOKENS_CAP)

    @property
    def budget(self) -> Budget:
        """The cap before children: the lowest of the Session's and the Agent's."""
        agent_budget = self.agent.limits.budget
        from_agent = (
            Budget(tokens=agent_budget.tokens, cost=agent_budget.cost_usd)
            if agent_budget
            else Budget()
        )
        return lowest(self.session_budget, from_agent)
