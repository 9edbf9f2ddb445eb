"""kopf handlers, one module per kind. Each is thin: gather, call a planner, apply."""

from . import agent, approval, evidence, freeze, goal, observe, pool, session

__all__ = ["agent", "approval", "evidence", "freeze", "goal", "observe", "pool", "session"]
