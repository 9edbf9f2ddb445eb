"""The turn: runs one submission through the engine, asking the policy at every seam.

It gathers the tools (the working tools and this submission's Menu), writes the prompt, every
model answer and every tool result to the conversation as they happen, enforces the pick rules
(only the first pick of a model answer runs; nothing runs after a pick that ended the turn),
routes `ask` outcomes to the approval port, and settles the submission. Every request's messages
are the engine's own list, with what the turn writes itself spliced in (ADR 0100).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from corral_api.kinds import SettlementStatus, ThinkingLevel
from corral_common import logs
from corral_common.catalog import ModelInfo, clamp_output_tokens, cost_usd, resolve_model

from . import metrics
from .conversations import Conversation, Submission, SweepStatus
from .custodian_client.menu import MenuClient, MenuUnavailable
from .delivery import TurnDelivery, task_of
from .engine.messages import for_provider, text_of, tool_result_block, user_text
from .engine.seam import (
    ALLOW,
    DID_NOT_RUN,
    EngineAdapter,
    EngineEvent,
    EngineHooks,
    EngineJob,
    EngineOutcome,
    EngineTool,
    Listener,
    MessageEnd,
    RequestPlan,
    StepBoundary,
    StopRun,
    ToolEnd,
    ToolGate,
    ToolStart,
    Usage,
)
from .events import summarise, usage_fields
from .ledger import Layer, Outcome, TurnLedger
from .memory import KEEP_TURNS, prune_turn_records
from .policy.structured import check_output, schema_instruction, send_back_reason
from .policy.tool_search import TOOL_SEARCH_NAME
from .ports import ApprovalPort, ToolCall, ToolSpec, TurnContext, TurnPolicy, TurnVerdict
from .telemetry import TRACING, RunTrace
from .tools import ToolResult, WorkingTools
from .turnshape.plan import PlanBook
from .turnshape.shaper import Finish, TurnShape

log = logging.getLogger(__name__)

SEND_BACKS = 2  # a denied completion goes back to the model at most this often


@dataclass
class TurnDeps:
    policy: TurnPolicy
    approvals: ApprovalPort
    tools: WorkingTools
    menu: MenuClient
    engine: Callable[[], Awaitable[EngineAdapter]]  # resolves once the SDK adapter is loaded
    granted_root: Path
    read_only: bool
    pick_sweep_seconds: float
    # Per-turn receipts, `<records_dir>/<conversation>/turn-<N>.json`; the last 20 are kept.
    records_dir: Path | None = None
    # Commits what the agent left and asks the custodian to push it, before each settlement
    # (docs/delivery.md); None: nothing is committed.
    delivery: TurnDelivery | None = None


class _Run:
    """The state of one submission's run, and the hooks and listener the engine calls."""

    def __init__(
        self,
        deps: TurnDeps,
        conv: Conversation,
        sub: Submission,
        ctx: TurnContext,
        specs: dict[str, ToolSpec],
        info: ModelInfo,
    ) -> None:
        self.deps = deps
        self.conv = conv
        self.sub = sub
        self.ctx = ctx
        self.specs = specs
        self.info = info
        self.turn_over = False  # a pick's answer ended the turn
        self.halted = ""  # an after-generation hook denied the answer: the run stops here
        self.picked_in_answer = False
        self.usage: Usage | None = None
        self.last_text = ""
        self.last_step_at = time.perf_counter()
        # The turn's ledger (docs/ledger.md): the loop and the tool runner append their own
        # entries; the receipt is made from it at settlement.
        self.ledger = TurnLedger()
        self.ledger.set_requested_loop(sub.agent.loop)
        self.token_layer: Layer = "reactive"  # the layer a model answer's tokens are booked to
        self.steps = 0  # tool calls started: what the runaway watch counts
        self.tokens = 0  # input + output over the turn's model calls, for the watch
        self.runaway = ""  # why the runaway watch stopped the turn
        self.engine: Any = None  # the engine running now (the watch aborts it)
        self.job: EngineJob | None = None  # the job on the transcript running now
        self._steers: list[tuple[str | None, ThinkingLevel | None]] = []
        # What the turn wrote to the transcript during this job besides what the engine appends
        # (steers, compaction entries), each at the length the engine's list had then.
        self._written: list[tuple[int, dict[str, Any]]] = []
        self._engine_length = 0
        self.trace: RunTrace = TRACING.run(ctx.run_id or sub.id, conv.id, info.name)
        self._allowed: set[str] = set()  # call ids that passed before_tool_call
        self.layer_tokens: dict[str, int] = {}
        self.output: Any = None  # the final answer, validated against the outputSchema
        # The settlement held while the turn's work is delivered (status, error).
        self.pending: tuple[SettlementStatus, dict[str, str] | None] | None = None
        # The turn's phases, route and plan (docs/turns.md); set before the first model call.
        self.shape: TurnShape | None = None

    # --------------------------------------------------------------------------- the hooks

    def begin_job(self, job: EngineJob) -> None:
        """A job on the transcript starts: its context is the transcript as it stands."""
        self.job = job
        self._written = []
        self._engine_length = len(job.context)

    async def convert_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The engine's list with what the turn wrote during this job spliced in where it was
        written. Rule: during a job the transcript grows only by what the engine appends (its
        answers and tool results, written as heard) and by `_write`, so the two stay equal."""
        self._engine_length = len(messages)
        self._apply_steers()  # a steer is written here, right before the next request
        return _spliced(messages, self._written)

    def _write(self, message: dict[str, Any]) -> None:
        """A message of the turn's own, not the engine's: into the transcript, and into every
        later request of this job at the place it was written."""
        self.conv.add_message(message)
        self._written.append((self._engine_length, message))

    async def before_request(self, messages: list[dict[str, Any]]) -> RequestPlan:
        if self.runaway:
            raise StopRun(self.runaway, "runaway")
        plan = await self.deps.policy.prepare_request(self.ctx, messages)
        self.layer_tokens = dict(plan.layer_tokens)
        if plan.stop_reason:
            raise StopRun(plan.stop_reason, plan.stop_error)
        if plan.compaction is not None:
            # A marked user message the next assembly recognises; appended, never sent as is.
            self._write(plan.compaction)
        system = plan.system
        if plan.call_only_lines:
            system = system + "\n\n" + "\n".join(plan.call_only_lines)
        if self.sub.output_schema is not None:
            # Every generation is told the answer's shape; never written to the transcript.
            system = system + "\n\n" + schema_instruction(self.sub.output_schema)
        self.trace.model_call(self.steps)
        return RequestPlan(
            system=system,
            messages=for_provider(plan.messages),
            stable_system=plan.stable_system,
        )

    # --------------------------------------------------------------------------- steering

    def steer(self, message: str | None, thinking: ThinkingLevel | None) -> None:
        """A later message of this turn (and/or a new thinking level), applied before the next
        model request: between tool calls it would split a call from its result."""
        self._steers.append((message, thinking))

    def _apply_steers(self) -> None:
        while self._steers:
            message, thinking = self._steers.pop(0)
            if thinking is not None and thinking != self.ctx.thinking_level:
                self.ctx = replace(self.ctx, thinking_level=thinking)
                if self.job is not None:
                    self.job.thinking_level = thinking  # read by every later request
            if message is not None:
                self._write(user_text(message))
            self.emit(
                "steered",
                thinkingLevel=self.ctx.thinking_level,
                **({"message": message} if message is not None else {}),
            )

    # --------------------------------------------------------------------------- runaway watch

    def _watch(self) -> None:
        """The runaway watch: past either per-turn cap the run stops, the call that tripped it
        and those after it get the did-not-run answer, and the turn settles `runaway`."""
        if self.runaway:
            return
        limits = self.sub.agent.limits
        if self.steps > limits.max_steps_per_turn:
            self.runaway = (
                f"the turn started more than {limits.max_steps_per_turn} tool calls "
                "(spec.limits.maxStepsPerTurn)"
            )
        elif self.tokens > limits.max_tokens_per_turn:
            self.runaway = (
                f"the turn spent {self.tokens} tokens, over {limits.max_tokens_per_turn} "
                "(spec.limits.maxTokensPerTurn)"
            )
        if self.runaway and self.engine is not None:
            self.engine.abort()

    async def before_tool_call(self, call: ToolCall) -> ToolGate:
        spec = self.specs[call.name]
        if self.shape is not None and (off := self.shape.refusal(spec)) is not None:
            # Not a step of the current phase: an error result, recorded, never run.
            self.emit("step_rejected", toolUseId=call.id, name=call.name, reason=off)
            return self._blocked(call, "deny", off)
        if self.turn_over:
            return self._blocked(call, "deny", "This call did not run: a pick ended the turn.")
        if self.halted:
            return self._blocked(call, "deny", f"This call did not run: {self.halted}")
        if spec.pick and self.picked_in_answer:
            return self._blocked(
                call, "deny", "This call did not run: only the first pick of a model answer runs."
            )
        if spec.writes and self.deps.read_only:
            return self._blocked(
                call, "deny", f"{call.name} is refused: this session is read-only."
            )
        decision = await self.deps.policy.decide_tool(self.ctx, call)
        if decision.outcome == "deny":
            gate = self._blocked(call, "deny", decision.reason or "denied by policy")
            return replace(gate, abort=decision.abort_turn)
        if decision.outcome == "ask":
            self.emit(
                "tool_blocked",
                toolUseId=call.id,
                name=call.name,
                outcome="ask",
                reason=decision.reason,
            )
            if not await self._approved(call, decision.reason):
                self.ledger.tool_blocked(call.name, "a human denied it")
                return ToolGate(block=f"A human denied this call of {call.name}.")
        if spec.pick:
            self.picked_in_answer = True
        self._allowed.add(call.id)
        return ToolGate(input=decision.input) if decision.input is not None else ALLOW

    def ends_run(self, step: int) -> bool:
        return self.turn_over or bool(self.halted)

    # --------------------------------------------------------------------------- the listener

    async def listen(self, event: EngineEvent) -> None:
        if isinstance(event, MessageEnd):
            self._on_message(event)
            await self._after_generation(event.message)
        elif isinstance(event, ToolStart):
            self.steps += 1
            self._watch()
            self.emit(
                "tool_start", toolUseId=event.call.id, name=event.call.name, input=event.call.input
            )
            self.trace.tool_start(event.call.id, event.call.name)
        elif isinstance(event, ToolEnd):
            await self._on_tool_end(event.call, event.result)
        elif isinstance(event, StepBoundary):
            now = time.perf_counter()
            metrics.STEP_SECONDS.observe(now - self.last_step_at)
            self.last_step_at = now
            self.emit("step_boundary", step=event.step)

    def _on_message(self, event: MessageEnd) -> None:
        self.picked_in_answer = False
        message = event.message
        usage = None
        if event.usage is not None:
            self.usage = _add(self.usage, event.usage)
            usage = self._usage_fields(event.usage)
            self.tokens += event.usage.tokens
            self.ledger.add_tokens(self.token_layer, event.usage)
            self.trace.model_done(event.usage.input, event.usage.output, event.stop_reason)
            metrics.TOKENS.labels("input").inc(event.usage.input)
            metrics.TOKENS.labels("output").inc(event.usage.output)
            self._watch()
        else:
            self.trace.model_done(0, 0, event.stop_reason)
        metrics.MODEL_REQUESTS.inc()
        if message["content"]:
            self.conv.add_message(message)
        text = text_of(message)
        if text:
            self.last_text = text
        self.emit(
            "message",
            role="assistant",
            content=message["content"],
            stopReason=event.stop_reason,
            usage=usage,
        )

    async def _after_generation(self, message: dict[str, Any]) -> None:
        """The after-generation hooks see each model answer; a denial stops the run here."""
        hook = getattr(self.deps.policy, "after_generation", None)
        if hook is None:
            return
        outcome = await hook(self.ctx, message)
        if getattr(outcome, "denied", False):
            self.halted = f"an after-generation hook denied the answer: {outcome.reason}"

    async def _on_tool_end(self, call: ToolCall, result: ToolResult) -> None:
        self.conv.add_tool_result(tool_result_block(call.id, result.content, result.is_error))
        if call.id in self._allowed:
            self.ledger.tool_run(call.name)
        if self.shape is not None and self.shape.collect is not None:
            # A checked step (a plan step, the oneTool call): its results are what the check
            # reads. The reactive loop collects nothing.
            self.shape.tool_ended(call, result)
            if call.id in self._allowed:
                self.shape.one_tool_done()
        self.trace.tool_end(call.id, error="tool_error" if result.is_error else None)
        metrics.TOOL_CALLS.labels(call.name, str(result.is_error).lower()).inc()
        spec = self.specs.get(call.name)
        # The driver sends the pick sweep when a pick's answer says the turn is over.
        ends_turn = {"endsTurn": True} if spec is not None and spec.pick and self.turn_over else {}
        self.emit(
            "tool_end",
            toolUseId=call.id,
            name=call.name,
            isError=result.is_error,
            result=summarise(result.content),
            **ends_turn,
        )
        with contextlib.suppress(Exception):  # a failing after-tool hook must not lose the result
            await self.deps.policy.after_tool(self.ctx, call, result.content, result.is_error)

    # --------------------------------------------------------------------------- helpers

    def emit(self, type_: str, **fields: Any) -> None:
        """An event of this submission on the conversation's stream."""
        self.conv.emit(type_, self.sub.id, **fields)

    def _blocked(self, call: ToolCall, outcome: Literal["deny", "ask"], reason: str) -> ToolGate:
        self.ledger.tool_blocked(call.name, reason)
        self.emit(
            "tool_blocked", toolUseId=call.id, name=call.name, outcome=outcome, reason=reason
        )
        return ToolGate(block=reason)

    async def _approved(self, call: ToolCall, reason: str) -> bool:
        approval_id = await self.deps.approvals.request(self.ctx, call, reason)
        self.emit("approval_requested", approvalId=approval_id, toolUseId=call.id, name=call.name)
        waiting = asyncio.ensure_future(self.deps.approvals.wait(approval_id))
        swept = asyncio.ensure_future(asyncio.shield(self.sub.sweep))
        pending: set[asyncio.Future[Any]] = {waiting, swept}
        done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        swept.cancel()
        if waiting not in done:
            waiting.cancel()
            return False
        return waiting.result() == "approved"

    def _usage_fields(self, usage: Usage) -> dict[str, Any]:
        cost = cost_usd(
            self.info,
            input=usage.input,
            output=usage.output,
            cache_read=usage.cache_read,
            cache_write=usage.cache_write,
        )
        return usage_fields(usage.input, usage.output, usage.cache_read, usage.cache_write, cost)

    def settlement_usage(self) -> dict[str, Any] | None:
        return None if self.usage is None else self._usage_fields(self.usage)

    def settle(self, status: SettlementStatus, error: dict[str, str] | None = None) -> None:
        if self.deps.delivery is not None:
            # Held until the work is committed and delivered (`release`), so the settlement
            # the operator reads comes after the custodian's delivery record.
            self.pending = (status, error)
            return
        self._settle_now(status, error)

    async def deliver(self) -> str | None:
        """Commit what the agent left and have the custodian push it; the revision."""
        if self.deps.delivery is None:
            return None
        return await self.deps.delivery.end_turn(
            agent=self.conv.agent,
            conversation=self.conv.id,
            submission=self.sub.id,
            task=task_of(self.conv.transcript),
            answer=self.last_text,
        )

    async def release(self) -> None:
        """Deliver, then publish the settlement `settle` held."""
        if self.pending is None:
            return
        try:
            await self.deliver()
        except Exception:  # the settlement must go out whatever delivery does
            log.exception("delivering the turn's work failed")
        status, error = self.pending
        self.pending = None
        self._settle_now(status, error)

    def add_side_usage(self, layer: str, usage: Usage) -> None:
        """A side call's model answer (the classifier, the planner): the submission's usage and
        the ledger's layer, never the transcript."""
        self.usage = _add(self.usage, usage)
        self.tokens += usage.tokens
        self.ledger.add_tokens(layer, usage)  # type: ignore[arg-type]

    def _settle_now(self, status: SettlementStatus, error: dict[str, str] | None) -> None:
        if self.shape is not None:
            self.shape.close(status)
        self._close_ledger(status)
        receipt = {
            **self.ledger.to_receipt(),
            "model": self.info.name,
            "thinkingLevel": self.ctx.thinking_level,
            "steps": self.steps,
            "contextTokens": self.layer_tokens,
            # As the settlement's: the cache reads and writes show what the prompt cache saved.
            "usage": self.settlement_usage(),
        }
        self.trace.end(
            status,
            error_type=error["type"] if error else None,
            tokens=self.tokens,
            steps=self.steps,
        )
        self.conv.settle(
            self.sub,
            status,
            error=error,
            usage=self.settlement_usage(),
            text=self.last_text,
            receipt=receipt,
            output=self.output if status == "completed" else None,
            extra=self.shape.status_fields() if self.shape is not None else None,
        )
        self._write_record(status, receipt)

    def _close_ledger(self, status: SettlementStatus) -> None:
        """The loop's last entries, unless a handler already wrote them: the answer and the
        terminal phase, and the outcome the settlement implies."""
        ledger = self.ledger
        terminal = {"completed": "done", "ended": "done", "failed": "failed", "aborted": "stopped"}
        if ledger.latest("phase") not in ("done", "failed", "stopped"):
            if status == "completed" and self.last_text and ledger.latest("phase") != "answer":
                ledger.phase("answer")
            ledger.phase(terminal[status])
        if ledger.latest("outcome") is None:
            outcome: Outcome = "success" if status in ("completed", "ended") else "abstain"
            if outcome == "abstain" and ledger.to_receipt()["toolsRun"]:
                outcome = "partial"  # some work was done before it stopped
            ledger.set_outcome(outcome)

    def _write_record(self, status: SettlementStatus, receipt: dict[str, Any]) -> None:
        """Keep the turn's receipt on the state volume; records past the last 20 go."""
        if self.deps.records_dir is None:
            return
        directory = self.deps.records_dir / self.conv.id
        number = list(self.conv.submissions).index(self.sub.id) + 1
        record = {"submissionId": self.sub.id, "status": status, **receipt}
        try:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / f"turn-{number}.json").write_text(json.dumps(record))
            prune_turn_records(directory, KEEP_TURNS)
        except OSError:
            log.exception("writing the turn record failed")  # the settlement stands regardless


def _spliced(
    messages: list[dict[str, Any]], written: list[tuple[int, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """`messages` with each written message inserted before the entry at its index."""
    spliced: list[dict[str, Any]] = []
    pending = iter(written)
    due = next(pending, None)
    for index, message in enumerate(messages):
        while due is not None and due[0] <= index:
            spliced.append(due[1])
            due = next(pending, None)
        spliced.append(message)
    while due is not None:
        spliced.append(due[1])
        due = next(pending, None)
    return spliced


class _JobRunner:
    """Runs the submission's engine jobs (the shaper's `JobRunner`): each on a fresh engine,
    the one the runaway watch aborts, until it ends or the submission's sweep comes."""

    def __init__(self, adapter: EngineAdapter, run: _Run, tools: list[EngineTool]) -> None:
        self.adapter = adapter
        self.run = run
        self.tools = tools

    async def main(self) -> EngineOutcome:
        """A job on the conversation's transcript as it stands, with the run's hooks and
        listener; a call the engine left unanswered gets the did-not-run answer."""
        run = self.run
        job = EngineJob(
            run.conv.id,
            run.info,
            run.ctx.thinking_level,
            "",
            self.tools,
            list(run.conv.transcript),
            None,
            run.ctx.max_output_tokens,
            run_id=run.ctx.run_id,
        )
        run.begin_job(job)
        outcome = await self._until_swept(job, run, run.listen)
        for call in outcome.unanswered:
            run.conv.add_tool_result(tool_result_block(call.id, DID_NOT_RUN, True))
        return outcome

    async def side(self, job: EngineJob, hooks: EngineHooks, listener: Listener) -> EngineOutcome:
        """A side call (the classifier, the planner): its own hooks and listener."""
        return await self._until_swept(job, hooks, listener)

    async def _until_swept(
        self, job: EngineJob, hooks: EngineHooks, listener: Listener
    ) -> EngineOutcome:
        engine = self.adapter()
        self.run.engine = engine
        task = asyncio.ensure_future(engine.run(job, hooks, listener))
        sweep_watch = asyncio.ensure_future(asyncio.shield(self.run.sub.sweep))
        pending: set[asyncio.Future[Any]] = {task, sweep_watch}
        try:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if task not in done:
                engine.abort()
            return await task
        finally:
            sweep_watch.cancel()


def _add(total: Usage | None, more: Usage) -> Usage:
    if total is None:
        return more
    return Usage(
        total.input + more.input,
        total.output + more.output,
        total.cache_read + more.cache_read,
        total.cache_write + more.cache_write,
    )


class Turn:
    """The conversation runner: one call runs one submission to its settlement."""

    def __init__(self, deps: TurnDeps) -> None:
        self.deps = deps
        # Each conversation's plan (docs/turns.md), kept across its turns in this process.
        self.plans: dict[str, PlanBook] = {}

    async def __call__(self, conv: Conversation, sub: Submission) -> None:
        runs: list[_Run] = []
        # Every line logged while this submission runs names its run (docs/observability.md).
        with logs.bound(runId=sub.run_id or sub.id):
            try:
                await self._submission(conv, sub, runs)
            finally:
                for run in runs:
                    await run.release()

    async def _submission(self, conv: Conversation, sub: Submission, runs: list[_Run]) -> None:
        deps = self.deps
        info = resolve_model(sub.model)
        thinking: ThinkingLevel = sub.thinking_level  # type: ignore[assignment]
        max_output = clamp_output_tokens(info, sub.agent.limits.max_output_tokens)
        ctx = TurnContext(
            conversation=conv.id,
            submission_id=sub.id,
            agent=sub.agent,
            model=info.name,
            thinking_level=thinking,
            granted_root=deps.granted_root,
            read_only=deps.read_only,
            context_window=info.context_window,
            max_output_tokens=max_output,
            run_id=sub.run_id or sub.id,
            memory_scope=conv.agent,
        )
        conv.add_message(user_text(sub.message))
        if sub.sweep.done():  # swept before it could start
            conv.settle(sub, sub.sweep.result(), error=_aborted_error(sub.sweep.result()))
            return
        try:
            menu = await deps.menu.surface(conv.id)
        except MenuUnavailable as exc:
            conv.settle(sub, "failed", error={"type": "menu_unavailable", "message": str(exc)})
            return
        catalog = deps.tools.specs() + menu
        visible = deps.policy.visible_tools(ctx, catalog)
        specs = {spec.name: spec for spec in visible}
        run = _Run(deps, conv, sub, ctx, specs, info)
        runs.append(run)
        sub.steer_to = run.steer
        run.emit(
            "turn_started",
            runId=ctx.run_id,
            requestedLoop=run.ledger.latest("requested_loop"),
            thinkingLevel=thinking,
        )
        tools = [EngineTool(spec, self._executor(spec, conv.id, run)) for spec in visible]
        runner = _JobRunner(await deps.engine(), run, tools)
        workspace = getattr(deps.tools, "workspace", None)
        run.shape = TurnShape(run, runner, self.plans, workspace)
        begun = await run.shape.begin()
        if isinstance(begun, Finish):
            run.settle(begun.status, begun.error)  # type: ignore[arg-type]
            return

        for attempt in range(SEND_BACKS + 1):
            outcome = await runner.main()
            if sub.sweep.done():
                break
            if run.runaway:
                run.settle("failed", {"type": "runaway", "message": run.runaway})
                return
            if run.halted:
                run.settle("failed", {"type": "hook_denied", "message": run.halted})
                return
            if outcome.status == "ended_by_hook":
                await self._await_sweep(sub, run)
                return
            if outcome.status == "failed" and outcome.error is not None:
                run.settle("failed", {"type": outcome.error.type, "message": outcome.error.message})
                return
            if outcome.status == "aborted":
                run.settle("aborted", _aborted_error("aborted", "the run was aborted by a hook"))
                return
            failure = "turn_rejected"
            verdict = self._check_output(sub, run, attempt)
            if verdict is None:
                verdict = await deps.policy.after_turn(ctx, run.last_text)
            else:
                failure = "output_invalid"
            if verdict.accept:
                run.settle("completed")
                return
            if verdict.stop or attempt == SEND_BACKS:
                run.settle("failed", {"type": failure, "message": verdict.reason})
                return
            run.shape.sent_back(verdict.reason)
            conv.add_message(user_text(f"The turn is not done yet: {verdict.reason}"))
        status = sub.sweep.result()
        run.settle(status, _aborted_error(status))

    @staticmethod
    def _check_output(sub: Submission, run: _Run, attempt: int) -> TurnVerdict | None:
        """The structured-output check, before the policy's own after-turn verdict: None when the
        answer is valid (or no schema was given), else the verdict that sends it back."""
        if sub.output_schema is None:
            return None
        output, errors = check_output(run.last_text, sub.output_schema)
        if not errors:
            run.output = output
            return None
        reason = send_back_reason(errors)
        if attempt == SEND_BACKS:
            reason += f" (sent back {SEND_BACKS} times; stopping)"
        return TurnVerdict(accept=False, reason=reason)

    async def _await_sweep(self, sub: Submission, run: _Run) -> None:
        wait = self.deps.pick_sweep_seconds
        try:
            status: SweepStatus = await asyncio.wait_for(asyncio.shield(sub.sweep), wait)
        except TimeoutError:
            message = f"a pick ended the turn and no sweep came within {wait:g} s"
            run.settle("aborted", _aborted_error("aborted", message))
            return
        run.settle(status, _aborted_error(status))

    def _executor(
        self, spec: ToolSpec, conversation: str, run: _Run
    ) -> Callable[[dict[str, Any]], Awaitable[ToolResult]]:
        if spec.kind == "menu":

            async def call_menu(args: dict[str, Any]) -> ToolResult:
                if spec.name.endswith("spawn_child"):
                    # A child starts from this working copy as it stands: deliver it first.
                    await run.deliver()
                answer = await self.deps.menu.invoke(conversation, spec.name, args, run.sub.id)
                if spec.pick and answer.ends_turn:
                    run.turn_over = True
                return ToolResult(answer.content, answer.is_error)

            return call_menu

        search = getattr(self.deps.policy, "answer_tool_search", None)
        if spec.name == TOOL_SEARCH_NAME and search is not None:
            # The policy answers from the list it showed this step; no process runs.

            async def call_search(args: dict[str, Any]) -> ToolResult:
                text = str(search(run.ctx, args))
                return ToolResult(text, text.startswith("error:"))

            return call_search

        async def call_working(args: dict[str, Any]) -> ToolResult:
            return await self.deps.tools.run(spec.name, args)

        return call_working


def _aborted_error(status: str, message: str = "the submission was swept by an abort") -> Any:
    if status == "ended":
        return None
    return {"type": "submission_aborted", "message": message}
