"""Kubernetes conditions, set so that `lastTransitionTime` moves only when a status flips."""

from __future__ import annotations

from typing import Literal

from corral_api import Condition

Status = Literal["True", "False", "Unknown"]


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: Status,
    reason: str,
    message: str,
    *,
    now: str,
    generation: int,
) -> list[Condition]:
    """A new list with `type_` set; the others kept in order, the new one appended."""
    out: list[Condition] = []
    found = False
    for cond in conditions:
        if cond.type != type_:
            out.append(cond)
            continue
        found = True
        since = cond.last_transition_time if cond.status == status else now
        out.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=since,
                observed_generation=generation,
            )
        )
    if not found:
        out.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=now,
                observed_generation=generation,
            )
        )
    return out


def remove_condition(conditions: list[Condition], type_: str) -> list[Condition]:
    return [c for c in conditions if c.type != type_]


def get_condition(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)
