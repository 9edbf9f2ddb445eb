"""What the driver remembers between turns, and what it hands back at the end.

`DriverState` mirrors the driver's fields of `SessionStatus` (same names, same camelCase), so
the operator's store can merge it into a Session's status and the local store can write it as
JSON. `phase`, `ledger` and `turns` are enough to resume: a ledger means a submission is in
flight (re-attach, never admit twice); no ledger with a non-final phase means the next turn is
still to be admitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from corral_api.kinds import (
    FINAL_PHASES,
    AdmissionLedger,
    LastTurn,
    SessionPhase,
    SettlementRecord,
    Usage,
    WaitingFor,
)
from corral_api.turnshape import PlanStatus
from corral_api.wire import SettledEvent, WireUsage


class DriverState(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    phase: SessionPhase = "Pending"
    turns: int = Field(default=0, ge=0)
    ledger: AdmissionLedger | None = None
    last_settlement: SettlementRecord | None = None
    # The last settled turn's ledger, summarised (docs/ledger.md).
    last_turn: LastTurn | None = None
    usage: Usage = Field(default_factory=Usage)
    evaluation_turns: int = Field(default=0, ge=0)
    # Turns a freeze interrupted: each continues under its own turn number (docs/freeze.md).
    freeze_interruptions: int = Field(default=0, ge=0)
    # Turns a lost sandbox pod interrupted: each is admitted again once, under its own turn
    # number (turn-<n>-resume-<k>), in the Session's new pod (docs/turns.md, "A lost pod").
    resume_interruptions: int = Field(default=0, ge=0)
    # The last accepted answer, validated against spec.outputSchema (docs/structured-output.md).
    output: Any = None
    # The last settled turn's final answer, clipped (a Goal's next wave reads it).
    answer: str | None = None
    # The one-shot wake (docs/wake.md): when it is due, and when it fired (it fires once).
    wake_at: str | None = None
    woken_at: str | None = None
    # Children (docs/children.md): the wait the parent last asked for, and the children whose
    # end was already sewn into its conversation (each reports once).
    waiting_for: WaitingFor | None = None
    reported_children: list[str] = Field(default_factory=list)
    # The turn's shape (docs/turns.md): the question a turn asked a person (WaitingForHuman
    # until spec.replies grows past replies_read), and the plan with each step's verdict.
    question: str | None = None
    replies_read: int = Field(default=0, ge=0)
    plan: PlanStatus | None = None
    message: str | None = None
    started_at: str | None = None
    finished_at: str | None = None

    @property
    def finished(self) -> bool:
        return self.phase in FINAL_PHASES

    def status_patch(self) -> dict[str, Any]:
        """The fields as a Session's status spells them (camelCase, JSON types)."""
        return self.model_dump(by_alias=True, mode="json")


def last_turn_of(settled: SettledEvent, turn: int) -> LastTurn | None:
    """The Session's summary of a settled turn's receipt; None when the turn never started."""
    receipt = settled.receipt
    if receipt is None:
        return None
    return LastTurn(
        turn=turn,
        route=receipt.route,
        handler=receipt.handler,
        requested_loop=receipt.requestedLoop,
        outcome=receipt.outcome,
        tools_run=len(receipt.toolsRun),
        tools_blocked=len(receipt.toolsBlocked),
        tokens=sum(receipt.tokensByLayer.model_dump().values()),
        phase_path=receipt.phasePath[:64],
        error_type=settled.error.type if settled.error else None,
    )


def add_usage(total: Usage, turn: WireUsage | None) -> Usage:
    if turn is None:
        return total
    return Usage(
        input_tokens=total.input_tokens + turn.input,
        output_tokens=total.output_tokens + turn.output,
        cache_read_tokens=total.cache_read_tokens + turn.cacheRead,
        cache_write_tokens=total.cache_write_tokens + turn.cacheWrite,
        cost=round(total.cost + turn.cost, 10),
    )


@dataclass(frozen=True)
class EvaluationResult:
    """One run of the evaluation guard's test after a turn."""

    passed: bool
    summary: str  # one line: what was checked and how it came out
    detail: str = ""  # e.g. the tail of the command's output, for the follow-up message


@dataclass(frozen=True)
class Decision:
    """What happens after a settlement: admit another turn, or finish in `phase`."""

    action: Literal["continue", "finish"]
    phase: SessionPhase
    message: str
    follow_up: str | None = None


@dataclass(frozen=True)
class DriverOutcome:
    phase: SessionPhase
    message: str
    turns: int
    usage: Usage
    text: str = ""  # the last settled turn's final answer
    output: Any = None  # the last accepted answer, validated against spec.outputSchema

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"
