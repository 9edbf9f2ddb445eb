"""What the custodian knows about its own session when a control tool is called.

Built afresh for every Menu read and every tool call (from the environment, and from the
cluster when one is configured), so a changed Agent or a settled turn shows on the next call.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral_api.kinds import MAX_CHILDREN_PER_TURN_CAP, MAX_DEPTH_CAP, AgentSpec


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
    cluster: bool = False  # a Kubernetes API server is configured
    land_check: str | None = None  # Evidence check name that must Pass before land

    @property
    def max_depth(self) -> int:
        """The Agent's depth limit, never above the hard cap."""
        return min(self.agent.limits.max_depth, MAX_DEPTH_CAP)

    @property
    def max_children_per_turn(self) -> int:
        return min(self.agent.limits.max_children_per_turn, MAX_CHILDREN_PER_TURN_CAP)

    @property
    def remaining_turns(self) -> int:
        """Turns this session still has, counting the one in progress."""
        return max(0, self.agent.limits.max_turns - self.turns_used)
