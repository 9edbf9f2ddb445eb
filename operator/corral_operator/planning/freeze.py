"""What a freeze means for the objects the operator writes: the Session's `Frozen` condition and
the Freeze's own `Active` condition. Which Freeze holds a Session is `corral_api.freeze`'s rule
(the custodian applies the same one); the Session planner decides what a hold stops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral_api.freeze import FROZEN_CONDITION, FrozenBy, in_force, scope_of
from corral_api.kinds import FreezeStatus, SessionStatus

from . import reasons as R
from .conditions import get_condition, remove_condition, set_condition

ACTIVE_CONDITION = "Active"


def with_frozen_condition(
    status: SessionStatus,
    frozen_by: FrozenBy | None,
    *,
    final: bool,
    now: str,
    generation: int,
) -> SessionStatus:
    """`status` with its `Frozen` condition: True while a Freeze holds it, False (Thawed) once
    lifted, absent on a Session that was never held or has ended."""
    conds = status.conditions
    held = get_condition(conds, FROZEN_CONDITION)
    if final:
        conds = remove_condition(conds, FROZEN_CONDITION)
    elif frozen_by is not None:
        conds = set_condition(
            conds, FROZEN_CONDITION, "True", R.FROZEN, frozen_by.describe(),
            now=now, generation=generation,
        )  # fmt: skip
    elif held is not None and held.status == "True":
        conds = set_condition(
            conds, FROZEN_CONDITION, "False", R.THAWED, "the freeze was lifted",
            now=now, generation=generation,
        )  # fmt: skip
    return status.model_copy(update={"conditions": conds})


@dataclass(frozen=True)
class FreezePlan:
    status: dict[str, Any]
    changed: bool


def plan_freeze(freeze: dict[str, Any], now: str) -> FreezePlan:
    """The Freeze's status: `Active` True (Frozen) while in force, False (Thawed) otherwise."""
    old = FreezeStatus.model_validate(freeze.get("status") or {})
    generation = int((freeze.get("metadata") or {}).get("generation") or 0)
    scope = scope_of(freeze)
    where = f"{scope[0]} {scope[1]}" if scope else "nothing"
    if in_force(freeze):
        value, reason, message = "True", R.FROZEN, f"holds the sessions of {where}"
    else:
        value, reason, message = "False", R.THAWED, f"lifted: {where} is not held"
    conds = set_condition(
        old.conditions, ACTIVE_CONDITION, value, reason, message,  # type: ignore[arg-type]
        now=now, generation=generation,
    )  # fmt: skip
    new = old.model_copy(update={"conditions": conds, "observed_generation": generation}).wire()
    return FreezePlan(new, new != old.wire())
