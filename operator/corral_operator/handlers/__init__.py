"""kopf handlers, one module per kind. Each is thin: gather, call a planner, apply."""

from . import agent, approval, evidence, goal, session

__all__ = ["agent", "approval", "evidence", "goal", "session"]
