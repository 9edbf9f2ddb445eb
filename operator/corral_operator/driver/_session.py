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
import logging
from datetime import UTC, datetime
from typing import Any

from corral_api.kinds import AdmissionLedger, AgentSpec, SessionSpec, SettlementRecord
from corral_api.timestamps import now_rfc3339
from corral_api.wire import AdmitRequest, SettledEvent
from corral_common import logs

from ._children import ChildrenReport, waiting_for_of
from ._decide import (
    SUSPEND_CAUSE,
    continuation_message,
    decide_after_settlement,
    evaluate_exit,
    evaluate_substring,
    freeze_interrupted,
    interrupted_decision,
    is_interrupted,
    needs_evaluation,
    resumed_decision,
    sandbox_lost,
)
from ._faults import AnswerTooLarge, ConversationLost, SettlementFault, WireFault
from ._ports import EventSink, TurnStore, WirePort
from ._state import (
    Decision,
    DriverOutcome,
    DriverState,
    EvaluationResult,
    add_usage,
    last_turn_of,
)
from ._wake import WAITING_FOR_WAKE, clip_answer, seconds_until_wake, time_text, with_wake

log = logging.getLogger("corral.driver")

DEFAULT_CHECK_TIMEOUT = 300


def admission_attempt(state: DriverState) -> str:
    """What tells a turn's admissions apart after a freeze or a lost pod interrupted it: each
    attempt gets an idempotency key of its own (and a run id of its own)."""
    attempt = f"-f{state.freeze_interruptions}" if state.freeze_interruptions else ""
    if state.resume_interruptions:
        attempt += f"-resume-{state.resume_interruptions}"
    return attempt


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
        children_report: ChildrenReport | None = None,
        resumed_from: str | None = None,
        resumed_wip: str | None = None,
    ) -> None:
        self._client = client
        # What finished children report to a parent resuming from WaitingForChildren.
        self._children_report = children_report
        self._wait_input: dict[str, Any] = {}
        self._store = store
        self._agent = agent
        self._session = session
        self._conversation = conversation
        self._on_event = on_event
        self._check_timeout = check_timeout
        self._abort_requested = False
        # The cause a freeze (or a suspend) asked to interrupt with; the session continues
        # once it is lifted.
        self._interrupt: str | None = None
        # A suspend that lets the turn in flight finish: nothing is admitted after it.
        self._hold_after_turn = False
        self._in_flight: str | None = None
        self._pick: str | None = None
        self._state = DriverState()
        # The replies the next admission starts from (docs/turns.md).
        self._replies: list[str] = []
        # The revision a resumed Session's new pod checked out (its note to the model names it).
        self._resumed_from = resumed_from
        # When the work in progress laid over that checkout was saved (None: none was).
        self._resumed_wip = resumed_wip

    @property
    def abort_requested(self) -> bool:
        return self._abort_requested

    @property
    def interrupted(self) -> bool:
        return self._interrupt is not None

    @property
    def in_flight(self) -> bool:
        """A turn is admitted and not settled yet (its work in progress is worth keeping)."""
        return self._in_flight is not None

    async def run(self) -> DriverOutcome:
        self._state = await self._store.load()
        state = self._state
        last_text = ""
        if state.finished:
            return self._outcome(last_text)
        if state.ledger is not None:
            ledger = state.ledger
            # A turn admitted before this driver (an earlier operator's): what it held for the
            # turn (the disruption budget's timer) went with that operator.
            await self._emit(
                {
                    "source": "driver",
                    "type": "reattached",
                    "turn": ledger.turn,
                    "submissionId": ledger.submission_id,
                }
            )
        else:
            if self._abort_requested:
                return await self._finish(Decision("finish", "Stopped", "stopped before a turn"))
            if self._interrupt is not None:
                held = f"frozen before turn {state.turns + 1} was admitted"
                return await self._finish(Decision("finish", state.phase, held))
            if is_interrupted(state):
                message = continuation_message(
                    state, self._session.task, self._resumed_from, self._resumed_wip
                )
            elif state.phase == WAITING_FOR_WAKE and self._session.wake is not None:
                if seconds_until_wake(state, datetime.now(UTC)) > 0:
                    return self._outcome(last_text)  # not woken yet: nothing to admit
                message = self._session.wake.message
                # Saved with the wake turn's ledger, in one write: fired once, admitted once.
                state.woken_at = time_text(datetime.now(UTC))
            elif state.phase == "WaitingForHuman" and state.question is not None:
                replies = self._session.replies[state.replies_read :]
                if not replies:
                    return self._outcome(last_text)  # no reply yet: nothing to admit
                message = "\n\n".join(replies)
                # Saved with the ledger, in one write: each reply starts one turn, once.
                self._replies = replies
                state.replies_read = len(self._session.replies)
                state.question = None
            elif state.turns == 0:
                message = self._session.task
            elif state.phase == "WaitingForChildren" and self._children_report is not None:
                message = self._children_report.message
                # Saved with the ledger, in one write: each child's line is sewn in once.
                state.reported_children = [
                    *state.reported_children,
                    *self._children_report.names,
                ]
            else:
                message = resume_message(state)
            ledger = await self._admit(message)
        while True:
            try:
                settled = await self._wait(ledger)
            except ConversationLost as lost:
                return await self._finish(
                    Decision("finish", "Failed", f"the harness lost the conversation: {lost}")
                )
            except AnswerTooLarge as too_large:
                # Every later read from this offset is as large: the turn cannot be followed.
                return await self._finish(
                    Decision("finish", "Failed", f"the turn cannot be followed: {too_large}")
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
            if self._interrupt is not None or self._hold_after_turn:
                # Frozen or suspended between turns: the follow-up is admitted (as a resume)
                # once lifted.
                between = Decision("finish", "Running", state.message or "held between turns")
                return await self._finish(between, last_text, saved=True)
            ledger = await self._admit(decision.follow_up)

    async def abort(self) -> None:
        """Abort the turn in flight (it settles `aborted`) and stop after it."""
        self._abort_requested = True
        if self._in_flight is not None:
            await self._client.abort(self._conversation, submission_id=self._in_flight)

    async def interrupt(self, cause: str) -> None:
        """A freeze: abort the turn in flight with `cause` and stop driving, not finished. The
        interrupted turn is not counted; its continuation is admitted after the freeze."""
        if self._interrupt is not None:
            return
        self._interrupt = cause
        if self._in_flight is not None:
            await self._client.abort(self._conversation, cause=cause, submission_id=self._in_flight)

    def hold_after_turn(self) -> None:
        """A suspend that lets the turn in flight finish: settle it as usual, then stop
        driving, not finished; the follow-up is admitted once the Session resumes."""
        self._hold_after_turn = True

    @property
    def holding(self) -> bool:
        return self._hold_after_turn

    # ------------------------------------------------------------------------------ steps

    async def _admit(self, message: str) -> AdmissionLedger:
        state = self._state
        overrides = self._session.overrides
        turn = state.turns + 1
        attempt = admission_attempt(state)
        # The run id the harness's spans, the custodian's log and ours share (docs/tracing.md).
        run_id = f"{self._conversation}.{turn}{attempt}"
        logs.bind(runId=run_id)  # this task's lines from here on name the run
        request = AdmitRequest(
            message=message,
            model=overrides.model if overrides else None,
            thinkingLevel=overrides.thinking_level if overrides else None,
            # The Session's loop (a child's is its parent's) over the Agent's.
            agent=self._agent.model_copy(update={"loop": overrides.loop})
            if overrides and overrides.loop
            else self._agent,
            turn=turn,
            outputSchema=self._session.output_schema,
            plan=self._session.plan,
            decideThenAct=self._session.decide_then_act or None,
            replies=self._replies or None,
            # The turn number names the admission: a driver that lost its ledger write (an API
            # error, a crash) admits again with the same key and gets the same submission. A
            # turn a freeze or a lost pod interrupted is admitted again under its number, with
            # a new key (turn-<n>-f<k>, turn-<n>-resume-<k>).
            idempotencyKey=f"turn-{turn}{attempt}",
            runId=run_id,
        )
        admitted = await self._client.admit(self._conversation, request)
        log.info(
            "turn %d of %s admitted as %s, run %s",
            turn,
            self._conversation,
            admitted.submissionId,
            run_id,
        )
        self._replies = []
        ledger = AdmissionLedger(
            stream_url=admitted.streamUrl,
            offset=admitted.offset,
            submission_id=admitted.submissionId,
            turn=turn,
        )
        state.ledger = ledger
        state.phase = "Running"
        state.started_at = state.started_at or now_rfc3339()
        await self._store.save(state)
        await self._emit(
            {
                "source": "driver",
                "type": "admitted",
                "turn": turn,
                "submissionId": admitted.submissionId,
                "runId": run_id,
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
        elif self._interrupt is not None:
            await self._client.abort(
                self._conversation, cause=self._interrupt, submission_id=ledger.submission_id
            )
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
        if kind == "tool_start" and str(event.get("name", "")).endswith("wait_children"):
            raw = event.get("input")
            self._wait_input = dict(raw) if isinstance(raw, dict) else {}
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
        interrupted = not self._abort_requested and freeze_interrupted(
            settled, self._interrupt is not None
        )
        lost = not interrupted and sandbox_lost(settled)
        if interrupted:
            state.freeze_interruptions += 1  # the turn itself is not counted
        elif lost:
            state.resume_interruptions += 1  # nor is a turn its lost pod cut short
        else:
            state.turns = max(state.turns, ledger.turn)
        state.usage = add_usage(state.usage, settled.usage)
        error = f"{settled.error.type}: {settled.error.message}" if settled.error else None
        if interrupted and self._interrupt == SUSPEND_CAUSE:
            # Recorded, so the turn's continuation after the resume says why it stopped.
            error = f"{SUSPEND_CAUSE}: the Session was suspended mid-turn (suspendMode: now)"
        state.last_settlement = SettlementRecord(
            submission_id=settled.submissionId, status=settled.status, error=error, turn=ledger.turn
        )
        state.last_turn = last_turn_of(settled, ledger.turn) or state.last_turn
        if settled.output is not None:
            state.output = settled.output  # saved with the settlement, in the same write
        state.question = settled.question if settled.status == "completed" else None
        if settled.plan is not None:
            state.plan = settled.plan
        state.answer = clip_answer(settled.text) or state.answer
        decision = (
            interrupted_decision(ledger.turn, self._interrupt)
            if interrupted
            else resumed_decision(ledger.turn, self._resumed_from, self._resumed_wip)
            if lost
            else decide_after_settlement(
                state=state,
                settled=settled,
                agent=self._agent,
                session=self._session,
                evaluation=evaluation,
                abort_requested=self._abort_requested,
                pick=self._pick,
            )
        )
        if not self._abort_requested:
            decision, wake_at = with_wake(
                decision, state, self._session, self._agent, datetime.now(UTC)
            )
            state.wake_at = wake_at or state.wake_at
        state.ledger = None
        state.message = decision.message
        state.phase = decision.phase
        if decision.phase == "WaitingForChildren":
            state.waiting_for = waiting_for_of(self._wait_input)
        if state.finished:
            state.finished_at = now_rfc3339()
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
                state.finished_at = now_rfc3339()
            await self._store.save(state)
        await self._emit(
            {
                "source": "driver",
                "type": "finished",
                # The state as saved: the store may have ended it otherwise (a failed delivery).
                "phase": state.phase,
                "message": state.message or decision.message,
            }
        )
        if state.finished:
            await self._end_session(state.phase)
        return self._outcome(text)

    async def _end_session(self, phase: str) -> None:
        """Tell the harness the session is over (its sessionEnd hooks run); best effort: the
        session's outcome stands whatever the harness answers, or if it is gone."""
        try:
            ended = await self._client.end(self._conversation, agent=self._agent, phase=phase)
        except Exception as exc:  # a port may fail in any way; the outcome is already saved
            await self._emit({"source": "driver", "type": "end_failed", "message": str(exc)})
            return
        if ended.denied:
            await self._emit(
                {"source": "driver", "type": "end_denied", "message": ended.reason or ""}
            )

    def _outcome(self, text: str) -> DriverOutcome:
        state = self._state
        return DriverOutcome(
            phase=state.phase,
            message=state.message or "",
            turns=state.turns,
            usage=state.usage,
            text=text,
            output=state.output,
        )

    async def _emit(self, event: dict[str, Any]) -> None:
        if self._on_event is None:
            return
        result = self._on_event(event)
        if inspect.isawaitable(result):
            await result


__all__ = ["SessionDriver", "admission_attempt", "resume_message"]
