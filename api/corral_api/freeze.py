"""Which Freeze holds a Session: one pure rule, read by the operator and the custodian alike.

A Freeze names one scope in its own namespace: a session tree (`scope.session`), an Agent's
sessions (`scope.agent`) or the whole namespace (`scope.namespace: true`). A Session is held when
a Freeze that is in force names it, its Agent or its namespace, or names any Session or Agent up
its parentRef chain: a freeze always flows down the tree, so a child can never keep working
while its parent is held. A Freeze is in force while `spec.frozen` is true and it is not being
deleted; deleting it (or `frozen: false`) lifts it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# The abort cause the operator sends on the wire when a freeze stops a turn in flight.
FREEZE_CAUSE = "freeze"
# The error type the custodian answers a model call with while its session is held.
FROZEN_ERROR = "session_frozen_error"
# The Session condition that says whether a freeze holds it.
FROZEN_CONDITION = "Frozen"


@dataclass(frozen=True)
class FrozenBy:
    """The Freeze that holds a Session, and through which of its ancestors (if any)."""

    freeze: str  # the Freeze's name
    scope: str  # "session NAME", "agent NAME" or "namespace NS"
    reason: str  # the person's words, possibly empty
    via: str | None = None  # the ancestor Session through which it applies, when not direct

    def describe(self) -> str:
        text = f"frozen by Freeze {self.freeze} ({self.scope}"
        if self.via is not None:
            text += f", through its ancestor session {self.via}"
        text += ")"
        return f"{text}: {self.reason}" if self.reason else text


def in_force(freeze: dict[str, Any]) -> bool:
    """Whether a Freeze holds anything now: `spec.frozen` (default true) and not deleting."""
    if (freeze.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return bool((freeze.get("spec") or {}).get("frozen", True))


def scope_of(freeze: dict[str, Any]) -> tuple[str, str] | None:
    """("session"|"agent"|"namespace", name) for a Freeze; None when its scope names nothing
    (the API server's rule forbids that; a hand-made dict may still try)."""
    scope = (freeze.get("spec") or {}).get("scope") or {}
    if scope.get("session"):
        return "session", str(scope["session"])
    if scope.get("agent"):
        return "agent", str(scope["agent"])
    if scope.get("namespace") is True:
        return "namespace", str((freeze.get("metadata") or {}).get("namespace") or "")
    return None


def _names(obj: dict[str, Any]) -> tuple[str, str, str]:
    md = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return (
        str(md.get("name") or ""),
        str(spec.get("agentRef") or ""),
        str(md.get("namespace") or ""),
    )


def covering_freeze(
    chain: Sequence[dict[str, Any]], freezes: Iterable[dict[str, Any]]
) -> FrozenBy | None:
    """The Freeze that holds `chain[0]`, a Session; `chain[1:]` are its ancestors, nearest
    first. Freezes of another namespace never count. The first Freeze by name wins, so the
    answer does not depend on the order the API server listed them in."""
    if not chain:
        return None
    namespace = _names(chain[0])[2]
    active = sorted(
        (f for f in freezes if in_force(f) and _names(f)[2] == namespace),
        key=lambda f: _names(f)[0],
    )
    for freeze in active:
        scope = scope_of(freeze)
        if scope is None:
            continue
        kind, target = scope
        for depth, session in enumerate(chain):
            name, agent, _ = _names(session)
            hit = (
                kind == "namespace"
                or (kind == "session" and name == target)
                or (kind == "agent" and agent == target)
            )
            if hit:
                return FrozenBy(
                    freeze=_names(freeze)[0],
                    scope=f"{kind} {target}",
                    reason=str((freeze.get("spec") or {}).get("reason") or ""),
                    via=name if depth else None,
                )
            if kind == "namespace":
                break
    return None


def needs_ancestors(freezes: Iterable[dict[str, Any]], namespace: str) -> bool:
    """Whether a Freeze in force names a session or an agent in `namespace`: only then can an
    ancestor matter, so a caller may skip walking the parent chain otherwise."""
    return any(
        in_force(f) and _names(f)[2] == namespace and (scope_of(f) or ("", ""))[0] != "namespace"
        for f in freezes
    )
