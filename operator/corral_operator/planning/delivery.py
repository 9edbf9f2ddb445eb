"""What the custodian's delivery record means for a Session (pure; docs/delivery.md).

After each settlement the operator reads the custodian's record (`GET :8082/v1/delivery`) and
writes `status.delivery` and the `Delivered` condition. A session that would end `Succeeded`
but whose last turn's work could not be pushed ends `Failed` with reason `DeliveryFailed`
instead: its answer was accepted, its work is not on the branch, and "Succeeded" would say
otherwise. A repo the custodian never pushes to (a local path, `noRemote`) is not a failure:
the condition says `NoRemote` and the outcome stands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from corral_api import Condition
from corral_api.kinds import Delivery
from corral_api.wire import DeliveryRecord

from . import reasons as R
from .conditions import set_condition

DELIVERED_CONDITION = "Delivered"


@dataclass(frozen=True)
class DeliveryVerdict:
    delivery: Delivery
    status: Literal["True", "False"]
    reason: str
    message: str
    # Set when the session must not read Succeeded: the message it fails with.
    fails_session: str | None = None


def judge_delivery(
    record: DeliveryRecord, submission_id: str | None, phase: str
) -> DeliveryVerdict | None:
    """The verdict on `record` for the turn that settled as `submission_id`; None when the
    record is not that turn's (the harness made no delivery for it)."""
    if submission_id is None or record.submissionId != submission_id:
        return None
    delivery = Delivery(
        branch=record.branch or None,
        revision=record.revision,
        pushed_at=record.pushedAt,
        state=record.state,
        message=record.message[:1000] or None,
    )
    if record.state == "Delivered":
        return DeliveryVerdict(delivery, "True", R.DELIVERED, record.message)
    if record.state == "NothingToDeliver":
        return DeliveryVerdict(delivery, "True", R.NOTHING_TO_DELIVER, record.message)
    if record.noRemote:
        return DeliveryVerdict(delivery, "False", R.NO_REMOTE, record.message)
    fails = f"the work was not delivered: {record.message}" if phase == "Succeeded" else None
    return DeliveryVerdict(delivery, "False", R.DELIVERY_FAILED, record.message, fails)


def with_delivered(
    conditions: list[Condition], verdict: DeliveryVerdict, *, now: str, generation: int
) -> list[Condition]:
    return set_condition(
        conditions,
        DELIVERED_CONDITION,
        verdict.status,
        verdict.reason,
        verdict.message[:1000],
        now=now,
        generation=generation,
    )
