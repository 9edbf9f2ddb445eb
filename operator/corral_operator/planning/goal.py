"""The Goal planner: its status, initialised and kept consistent with its spec."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from corral_api.kinds import GoalSpec, GoalStatus

from .conditions import set_condition


def plan_goal(body: dict[str, Any], now: str) -> tuple[dict[str, Any], bool]:
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    old = GoalStatus.model_validate(body.get("status") or {})
    try:
        GoalSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        status, reason, message = "False", "InvalidSpec", f"spec.{where}: {first['msg']}"
    else:
        status, reason, message = "True", "Accepted", "waiting for waves to run"
    conds = set_condition(
        old.conditions,
        "Ready",
        status,  # type: ignore[arg-type]
        reason,
        message,
        now=now,
        generation=generation,
    )
    new = old.model_copy(update={"conditions": conds, "observed_generation": generation}).wire()
    return new, new != old.wire()
