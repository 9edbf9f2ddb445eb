"""A Session's PodDisruptionBudget: while its sandbox pod must not go, the operator holds a
budget that allows no voluntary disruption of it, so a drain's evictions are refused (429) and
retried until it is lifted (docs/operations.md, "Drains"; `Agent.spec.sandbox.disruption`).

`allow` never holds one; `never` holds one from the first admission for the pod's whole life;
`whenIdle` holds one from each admission until the turn settles, or for `maxWaitSeconds` of
that turn, whichever is first. The budget is named like the Session's cold pod, selects the
pod by its Session label and is owned by the pod, so it goes with the pod. Which turn holds it
is written on it (`corral.dev/turn`), so a turn's max-wait timer lifts only its own.

It says `minAvailable: 1`, not `maxUnavailable: 0`: the disruption controller scales a
maxUnavailable by the pods' controller, and a sandbox's controller is its Session, which has
no scale subresource, so that budget's status would never be computed (evictions refused, the
controller retrying its sync forever). An integer minAvailable needs no controller.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from corral_api.kinds import Disruption
from corral_kube import KubeError

from .. import naming
from ..kube import object_path
from .context import LoopContext

log = logging.getLogger("corral.operator.session")

ANNOTATION_TURN = "corral.dev/turn"
BUDGET_API_VERSION = "policy/v1"
BUDGET_KIND = "PodDisruptionBudget"


# ---------------------------------------------------------------------- what to hold (pure)


def disruption_budget(
    disruption: Disruption, session: str, pod: dict[str, Any], turn: int
) -> dict[str, Any] | None:
    """The budget that keeps `pod` (the Session's sandbox) through `turn`, or None when the
    policy holds none. Under `never` it names no turn: the pod holds it, not a turn."""
    if disruption.policy == "allow":
        return None
    md = pod["metadata"]
    session_label = naming.label_value(session)
    annotations = {ANNOTATION_TURN: str(turn)} if disruption.policy == "whenIdle" else {}
    return {
        "apiVersion": BUDGET_API_VERSION,
        "kind": BUDGET_KIND,
        "metadata": {
            "name": naming.pod_name(session),
            "namespace": md["namespace"],
            "labels": {
                naming.LABEL_SESSION: session_label,
                naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
            },
            "annotations": annotations,
            # Not the controller: only a tie to the pod, which the garbage collector follows.
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": md["name"],
                    "uid": md["uid"],
                    "controller": False,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {
            "minAvailable": 1,
            "selector": {
                "matchLabels": {
                    naming.LABEL_SESSION: session_label,
                    naming.LABEL_COMPONENT: "sandbox",
                }
            },
        },
    }


def lifted_at_settlement(disruption: Disruption) -> bool:
    """Whether a turn's settlement lifts the budget (only a turn holds it)."""
    return disruption.policy == "whenIdle"


def max_wait(disruption: Disruption) -> float | None:
    """Seconds after its admission at which a turn stops holding off a drain; None: never."""
    return float(disruption.max_wait_seconds) if disruption.policy == "whenIdle" else None


def held_by(budget: dict[str, Any]) -> int | None:
    """The turn that holds `budget`, None when it names none."""
    text = ((budget.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_TURN)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _owner_uid(budget: dict[str, Any]) -> str | None:
    owners = (budget.get("metadata") or {}).get("ownerReferences") or []
    return next((str(o.get("uid")) for o in owners if o.get("kind") == "Pod"), None)


def is_stale(found: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether `found`, where `wanted` was to be created, must be replaced: it belongs to an
    earlier pod (the garbage collector has not reached it yet) or names another turn (one
    whose settlement could not lift it), whose max-wait timer would lift it too early."""
    return _owner_uid(found) != _owner_uid(wanted) or held_by(found) != held_by(wanted)


def lifted_by_timer(found: dict[str, Any] | None, turn: int) -> bool:
    """Whether `turn`'s max-wait timer lifts the budget found: only one that turn (or an
    earlier one that left it behind) holds, never a later turn's, never the pod's (`never`)."""
    if found is None:
        return False
    holder = held_by(found)
    return holder is not None and holder <= turn


# -------------------------------------------------------------------- holding it (the API)


class TurnBudget:
    """One Session's budget as its driver's turns are admitted and settle. Each event is applied
    in a task of its own (`ctx.background`), in the order the driver reported them (one lock:
    a settlement's delete never overtakes its admission's create). A failure is logged and
    never stops the turn: a drain then simply does not wait for it."""

    def __init__(self, ctx: LoopContext, disruption: Disruption) -> None:
        self._ctx = ctx
        self._disruption = disruption
        self._order = asyncio.Lock()

    @property
    def _path(self) -> str:
        return object_path(
            BUDGET_API_VERSION, BUDGET_KIND, self._ctx.namespace, naming.pod_name(self._ctx.name)
        )

    async def follow(self, event: dict[str, Any]) -> None:
        """The driver's `admitted` holds the budget, its `settled` lifts it (whenIdle). Its
        `reattached` (an operator that took over a turn in flight, after a restart or as the
        new leader) holds it too: the budget the earlier operator made is kept, or made again if
        it is missing, and the max-wait timer that operator ran, gone with it, starts again
        (so the wait is at most maxWaitSeconds from the takeover)."""
        if self._disruption.policy == "allow":
            return  # never held: nothing to create or delete
        kind, turn = event.get("type"), int(event.get("turn") or 0)
        async with self._order:
            try:
                if kind in ("admitted", "reattached"):
                    await self._hold(turn)
                elif kind == "settled" and lifted_at_settlement(self._disruption):
                    await self._ctx.kube.delete(self._path)
            except KubeError as err:
                log.warning(
                    "session %s/%s: disruption budget not %s for turn %s: %s",
                    self._ctx.namespace, self._ctx.name,
                    "held" if kind == "admitted" else "lifted", turn, err,
                )  # fmt: skip

    async def _hold(self, turn: int) -> None:
        pod = await self._ctx.read_pod()
        if pod is None or not pod["metadata"].get("uid"):
            return  # gone: nothing to keep, and the Session resumes or fails without it
        wanted = disruption_budget(self._disruption, self._ctx.name, pod, turn)
        if wanted is None:
            return
        if not await self._ctx.kube.create(wanted):
            found = await self._ctx.kube.get(self._path)
            if found is None or is_stale(found, wanted):
                await self._ctx.kube.delete(self._path)
                await self._ctx.kube.create(wanted)
        seconds = max_wait(self._disruption)
        if seconds is not None:
            self._ctx.background(self._lift_after(turn, seconds))

    async def _lift_after(self, turn: int, seconds: float) -> None:
        """`turn`'s max-wait: the budget lifted if that turn still holds it."""
        await asyncio.sleep(seconds)
        async with self._order:
            try:
                if lifted_by_timer(await self._ctx.kube.get(self._path), turn):
                    await self._ctx.kube.delete(self._path)
                    log.info(
                        "session %s/%s: turn %d held off a drain for %.0f s: budget lifted",
                        self._ctx.namespace, self._ctx.name, turn, seconds,
                    )  # fmt: skip
            except KubeError as err:
                log.warning(
                    "session %s/%s: disruption budget not lifted after turn %d's wait: %s",
                    self._ctx.namespace, self._ctx.name, turn, err,
                )  # fmt: skip
