"""`SessionDriver`: drive one session's turns through the wire until the session ends.

The same code runs in the operator (state in the Session's status) and in `corral run` (state
in a local directory); only the `TurnStore` differs. Every step that matters is saved before
the next one starts, so a restarted driver re-attaches to the submission in its ledger instead
of admitting the same turn twice.

`on_event` receives every wire event as received (their own shapes, see the harness's
`events` module), and the driver's own events, marked `source: "driver"`:

- `admitted` {turn, submissionId, message}: a turn was admitted and its ledger saved;
- `settled` {turn, submissionId, status, error, usage, pick, loop, evaluation: {passed,
  summary} | null, decision: {action, phase, message}}: a settlement was recorded and judged;
- `finished` {phase, message}: the driver stops; the session is in `phase`.
"""

from __future__ import annotations

import inspect
from datetime import UTC, datetime
from typing import Any

from corral_api.kinds import AdmissionLedger, AgentSpec, SessionSpec, SettlementRecord
from corral_api.wire import AdmitRequest, SettledEvent

from ._decide import (
    decide_after_settlement,
    evaluate_exit,
    evaluate_substring,
    needs_evaluation,
)
from ._faults import ConversationLost, SettlementFault, WireFault
from ._ports import EventSink, TurnStore, WirePort
from ._state import Decision, DriverOutcome, DriverState, EvaluationResult, add_usage

DEFAULT_CHECK_TIMEOUT = 300


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resume_message(state: DriverState) -> str:
    """The follow-up for a turn that was decided but never admitted (a restart in between)."""
    why = state.message or "the last turn did not finish the task"
    return f"Your last turn did not finish the task ({why}). Continue working on the task."


class SessionDriver:
    def __init__(
        self,
        client: WirePort,
        store: TurnStore,
        agent: AgentSpec,
        session: SessionSpec,
        conversation: str,
        on_event: EventSink | None = None,
        *,
        check_timeout: int = DEFAULT_CHECK_TIMEOUT,
    ) -> None:
        self._client = client
        self._store = store
        self._agent = agent
        self._session = session
        self._conversation = conversation
        self._on_event = on_event
        self._check_timeout = check_timeout
        self._abort_requested = False
        self._in_flight: str | None = None
        self._pick: str | None = None
        self._state = DriverState()

    @property
    def abort_requested(self) -> bool:
        return self._abort_requested

    async def run(self) -> DriverOutcome:
        self._state = await self._store.load()
        state = self._state
        last_text = ""
        if state.finished:
            return self._outcome(last_text)
        if state.ledger is not None:
            ledger = state.ledger
        else:
            if self._abort_requested:
                return await self._finish(Decision("finish", "Stopped", "stopped before a turn"))
            first = state.turns == 0
            message = self._session.task if first else resume_message(state)
            ledger = await self._admit(message)
        while True:
            try:
                settled = await self._wait(ledger)
            except ConversationLost as lost:
                return await self._finish(
                    Decision("finish", "Failed", f"the harness lost the conversation: {lost}")
                )
            last_text = settled.text
            decision = await self._settle(ledger, settled)
            if decision.action == "finish" or decision.follow_up is None:
                return await self._finish(decision, last_text, saved=True)
            if self._abort_requested:
                return await self._finish(
                    Decision("finish", "Stopped", f"stopped on request after turn {ledger.turn}"),
                    last_text,
                )
            ledger = await self._admit(decision.follow_up)

    async def abort(self) -> None:
        """Abort the turn in flight (it settles `aborted`) and stop after it."""
        self._abort_requested = True
        if self._in_flight is not None:
            await self._client.abort(self._conversation, submission_id=self._in_flight)

    # ------------------------------------------------------------------------------ steps

    async def _admit(self, message: str) -> AdmissionLedger:
        state = self._state
        overrides = self._session.overrides
        turn = state.turns + 1
        request = AdmitRequest(
            message=message,
            model=overrides.model if overrides else None,
            thinkingLevel=overrides.thinking_level if overrides else None,
            agent=self._agent,
            turn=turn,
            # The turn number names the admission: a driver that lost its ledger write (an API
            # error, a crash) admits again with the same key and gets the same submission.
            idempotencyKey=f"turn-{turn}",
        )
        admitted = await self._client.admit(self._conversation, request)
        ledger = AdmissionLedger(
            stream_url=admitted.streamUrl,
            offset=admitted.offset,
            submission_id=admitted.submissionId,
            turn=turn,
        )
        state.ledger = ledger
        state.phase = "Running"
        state.started_at = state.started_at or _now()
        await self._store.save(state)
        await self._emit(
            {
                "source": "driver",
                "type": "admitted",
                "turn": turn,
                "submissionId": admitted.submissionId,
                "message": message,
            }
        )
        return ledger

    async def _wait(self, ledger: AdmissionLedger) -> SettledEvent:
        self._in_flight = ledger.submission_id
        self._pick = None
        if self._abort_requested:
            # An abort that arrived while the admission was on its way.
            await self._client.abort(self._conversation, submission_id=ledger.submission_id)
        try:
            return await self._client.wait(self._conversation, ledger, self._on_wire_event)
        except SettlementFault as fault:
            return fault.settled
        finally:
            self._in_flight = None

    async def _on_wire_event(self, event: dict[str, Any]) -> None:
        await self._emit(event)
        if event.get("submissionId") != self._in_flight:
            return  # an earlier submission's event, read again after a re-attach
        kind = event.get("type")
        state = self._state
        if kind == "approval_requested" and state.phase == "Running":
            state.phase = "WaitingForHuman"
            await self._store.save(state)
        elif kind in ("tool_start", "tool_end", "message") and state.phase == "WaitingForHuman":
            state.phase = "Running"
            await self._store.save(state)
        if kind == "tool_end" and event.get("endsTurn") and self._pick is None:
            # The turn's own pick ended it: say so in the sweep, so it settles `ended`.
            self._pick = str(event.get("name", ""))
            await self._client.abort(
                self._conversation, cause="pick", submission_id=self._in_flight
            )

    async def _settle(self, ledger: AdmissionLedger, settled: SettledEvent) -> Decision:
        state = self._state
        evaluation: EvaluationResult | None = None
        guard = self._session.evaluation
        if (
            guard is not None
            and not self._abort_requested
            and needs_evaluation(settled, self._pick)
        ):
            evaluation = await self._evaluate(settled)
            state.evaluation_turns += 1
        state.turns = max(state.turns, ledger.turn)
        state.usage = add_usage(state.usage, settled.usage)
        error = f"{settled.error.type}: {settled.error.message}" if settled.error else None
        state.last_settlement = SettlementRecord(
            submission_id=settled.submissionId, status=settled.status, error=error, turn=ledger.turn
        )
        decision = decide_after_settlement(
            state=state,
            settled=settled,
            agent=self._agent,
            session=self._session,
            evaluation=evaluation,
            abort_requested=self._abort_requested,
            pick=self._pick,
        )
        state.ledger = None
        state.message = decision.message
        state.phase = decision.phase
        if state.finished:
            state.finished_at = _now()
        # One save records the settlement and what follows it, so a restart sees both or none.
        await self._store.save(state)
        await self._emit(
            {
                "source": "driver",
                "type": "settled",
                "turn": ledger.turn,
                "submissionId": settled.submissionId,
                "status": settled.status,
                "error": error,
                "usage": settled.usage.model_dump() if settled.usage else None,
                "pick": self._pick,
                "loop": self._agent.loop,
                "evaluation": None
                if evaluation is None
                else {"passed": evaluation.passed, "summary": evaluation.summary},
                "decision": {
                    "action": decision.action,
                    "phase": decision.phase,
                    "message": decision.message,
                },
            }
        )
        return decision

    async def _evaluate(self, settled: SettledEvent) -> EvaluationResult:
        guard = self._session.evaluation
        assert guard is not None
        criteria = guard.criteria
        if criteria.substring is not None:
            return evaluate_substring(criteria.substring, settled.text)
        command = criteria.command or ""
        try:
            result = await self._client.checks(command, self._check_timeout)
        except WireFault as fault:
            return EvaluationResult(False, f"`{command}` could not run: {fault}")
        return evaluate_exit(command, result.exit_code, result.output, result.timed_out)

    async def _finish(
        self, decision: Decision, text: str = "", saved: bool = False
    ) -> DriverOutcome:
        state = self._state
        if not saved:
            state.phase = decision.phase
            state.message = decision.message
            state.ledger = None
            if state.finished:
                state.finished_at = _now()
            await self._store.save(state)
        await self._emit(
            {
                "source": "driver",
                "type": "finished",
                "phase": decision.phase,
                "message": decision.message,
            }
        )
        return self._outcome(text)

    def _outcome(self, text: str) -> DriverOutcome:
        state = self._state
        return DriverOutcome(
            phase=state.phase,
            message=state.message or "",
            turns=state.turns,
            usage=state.usage,
            text=text,
        )

    async def _emit(self, event: dict[str, Any]) -> None:
        if self._on_event is None:
            return
        result = self._on_event(event)
        if inspect.isawaitable(result):
            await result


__all__ = ["SessionDriver", "resume_message"]
