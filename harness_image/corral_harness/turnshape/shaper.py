"""The turn's decision layer: walks the phases, asks the classifier, and runs every route but
the reactive loop (which stays the turn's own, unchanged, so its steps cost what they did).

The turn hands it a `ShapeHost` (its run: the transcript, the events, the ledger) and a
`JobRunner` that runs engine jobs under the submission's sweep: a job on the transcript with the
turn's own hooks, or a side call (the classifier, the planner) with hooks of its own, whose
exchanges are not written to the transcript; the runtime writes what they decided (the plan's
body) instead.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from corral_api.turnshape import ForcedPlan, RouteName
from corral_common.catalog import ModelInfo, resolve_model

from ..context import merge_adjacent_roles
from ..engine.messages import for_provider, user_text
from ..engine.seam import (
    ALLOW,
    EngineEvent,
    EngineHooks,
    EngineJob,
    EngineOutcome,
    EngineTool,
    Listener,
    MessageEnd,
    RequestPlan,
    ToolEnd,
    ToolGate,
    Usage,
)
from ..ports import ToolCall, ToolSpec, TurnContext, Workspace, WorkspaceError
from ..tools import ToolResult
from .checks import Evidence, ToolOutcome, evidence_commands, verdict
from .phases import OffPath, Phase, PhaseMachine, StepKind, step_refusal
from .plan import PLAN_SPECS, PLAN_TOOLS, PlanBook
from .scheduler import (
    CLASSIFIER_SYSTEM,
    CLASSIFIER_UNAVAILABLE,
    CLASSIFY_SPEC,
    CLASSIFY_TOOL,
    Classification,
    Start,
    after_classification,
    parse_classification,
    start,
)

log = logging.getLogger(__name__)

EVIDENCE_TIMEOUT_SECONDS = 120.0
PLANNER_STEPS = 3  # model answers the planner gets to open (or edit) a valid plan
_REFUSAL = re.compile(r"^\s*(no|reject|rejected|stop|deny|denied)\b", re.IGNORECASE)

PLANNER_SYSTEM = (
    "You plan a coding task as a checklist. Call plan_open once with the steps in order; every "
    "step carries a machine check on its own tool results (token, contains, absent, exitCode, "
    "json {path, equals}, evidence: a command the runtime runs, either: [checks]). What you "
    "write about your work is never read: only the checks decide."
)


class ShapeHost(Protocol):
    """What the shaper needs of the turn's run."""

    conv: Any
    sub: Any
    ctx: TurnContext
    info: ModelInfo
    ledger: Any
    last_text: str
    token_layer: Any
    specs: dict[str, ToolSpec]
    deps: Any

    def emit(self, type_: str, **fields: Any) -> None:
        """An event of the submission on the conversation's stream."""
        ...

    def add_side_usage(self, layer: str, usage: Usage) -> None: ...


class JobRunner(Protocol):
    """How the shaper runs engine jobs: the turn runs each under the submission's sweep."""

    async def main(self) -> EngineOutcome:
        """A job on the conversation's transcript as it stands, with the turn's own hooks (its
        answers and tool results are written as they happen)."""
        ...

    async def side(self, job: EngineJob, hooks: EngineHooks, listener: Listener) -> EngineOutcome:
        """A side call with its own hooks and listener: nothing of it reaches the transcript."""
        ...


@dataclass
class Finish:
    """How the shaper settled the turn: the settlement's status and error."""

    status: str
    error: dict[str, str] | None = None


@dataclass
class _SideHooks:
    """Hooks of a side call: its own messages, a fixed system prompt, its own gate."""

    system: str
    gate: Callable[[ToolCall], ToolGate]
    stop_after: Callable[[int], bool]

    async def convert_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return merge_adjacent_roles(messages)

    async def before_request(self, messages: list[dict[str, Any]]) -> RequestPlan:
        return RequestPlan(system=self.system, messages=for_provider(messages))

    async def before_tool_call(self, call: ToolCall) -> ToolGate:
        return self.gate(call)

    def ends_run(self, step: int) -> bool:
        return self.stop_after(step)


@dataclass
class TurnShape:
    host: ShapeHost
    runner: JobRunner
    plans: dict[str, PlanBook]
    workspace: Workspace | None = None
    machine: PhaseMachine = field(init=False)
    # The tool results of the step being checked; None outside a checked step (the reactive
    # loop never collects: its steps do no extra work).
    collect: list[ToolOutcome] | None = None
    question: str | None = None
    book: PlanBook | None = None
    understood: Classification | None = None
    one_tool: bool = False  # the oneTool route: its first call that runs is its one step

    def __post_init__(self) -> None:
        self.machine = PhaseMachine(on_enter=self._entered, on_end=self._ended)

    # ------------------------------------------------------------------ records

    def _entered(self, phase: Phase) -> None:
        self.host.ledger.phase(phase.value)

    def _ended(self, phase: Phase, detail: str) -> None:
        # Each phase's state is written once, when it ends, before the next one sees anything.
        self.host.emit("phase", phase=phase.value, **({"detail": detail} if detail else {}))

    def move(self, *phases: Phase, detail: str = "") -> None:
        for phase in phases:
            self.machine.move(phase, detail if phase is phases[-1] else "")

    # ------------------------------------------------------------------ the gate

    def refusal(self, spec: ToolSpec) -> str | None:
        """Why a call of `spec` is not a step of the current phase (None: it is)."""
        kind: StepKind = (
            "plan"
            if spec.name in PLAN_TOOLS
            else "work"
            if spec.writes or spec.kind == "menu"
            else "read"
        )
        return step_refusal(self.machine.current, kind, spec.name)

    def tool_ended(self, call: ToolCall, result: ToolResult) -> None:
        if self.collect is not None:
            self.collect.append(ToolOutcome(call.name, result.content, result.is_error))

    # ------------------------------------------------------------------ beginning a turn

    async def begin(self) -> RouteName | Finish:
        """Choose the route; run it unless it is the reactive loop. Returns "reactive" (the turn
        runs its own loop, in phase execute) or how the turn settled."""
        sub, agent = self.host.sub, self.host.sub.agent
        forced = sub.plan
        book = self.plans.get(self.host.conv.id)
        if forced is not None and book is not None and book.state == "Done":
            forced = None  # the forced plan already ran to its end: the scheduler decides now
        first = start(
            loop=agent.loop,
            forced_plan=forced is not None,
            classifier_model=agent.scheduler.classifier_model,
            decide_then_act=sub.decide_then_act,
        )
        investigated = False
        while True:
            if first.action == "classify":
                found = await self._classify(again=investigated)
                first = after_classification(
                    found, decide_then_act=sub.decide_then_act, investigated=investigated
                )
                if first.action == "stop" and first.reason == "ask":
                    assert isinstance(found, Classification)
                    return self._ask(found.question)
            if first.action == "stop":
                self.move(Phase.FAILED, detail=first.reason)
                return Finish("failed", {"type": CLASSIFIER_UNAVAILABLE, "message": first.reason})
            assert first.route is not None
            self.move(Phase.CHOOSE_ROUTE, detail=first.reason or first.route)
            self.host.ledger.set_route(first.route)
            self.host.ledger.set_handler(first.handler)
            self.host.emit("route", route=first.route, handler=first.handler, reason=first.reason)
            if first.route == "investigate" and not investigated:
                investigated = True
                outcome = await self._investigate()
                if isinstance(outcome, Finish):
                    return outcome
                first = (
                    Start("classify")
                    if agent.scheduler.classifier_model
                    else after_classification(
                        "no classifier is configured to classify again",
                        decide_then_act=sub.decide_then_act,
                        investigated=True,
                    )
                )
                continue
            break
        route = first.route
        if route == "reactive" or (route == "investigate" and investigated):
            self.move(Phase.EXECUTE)
            return "reactive"
        if route == "direct":
            self.move(Phase.ANSWER)
            return await self._answer_run("direct")
        if route == "oneTool":
            self.move(Phase.EXECUTE)
            return await self._answer_run("oneTool")
        return await self._checklist(forced)

    # ------------------------------------------------------------------ the classifier

    async def _classify(self, *, again: bool) -> Classification | str:
        if self.machine.current is not Phase.UNDERSTAND:
            self.move(Phase.UNDERSTAND)
        agent = self.host.sub.agent
        name = agent.scheduler.classifier_model
        try:
            info = resolve_model(name)
        except Exception as exc:  # an unknown model: the classifier is not usable
            return f"classifier model {name!r}: {exc}"
        answer: dict[str, Any] = {}

        async def record(args: dict[str, Any]) -> ToolResult:
            answer.update(args)
            return ToolResult("recorded")

        hooks = _SideHooks(CLASSIFIER_SYSTEM, lambda call: ALLOW, lambda step: True)
        outcome = await self._side_run(
            info,
            hooks,
            [EngineTool(CLASSIFY_SPEC, record)],
            "classifier",
            agent.scheduler.classifier_max_tokens,
            self._classifier_prompt(again),
            # The conversation before this turn's message (the prompt carries it); after an
            # investigation, everything it found too.
            list(self.host.conv.transcript if again else self.host.conv.transcript[:-1]),
        )
        if outcome.status == "failed" and outcome.error is not None:
            return f"{outcome.error.type}: {outcome.error.message}"
        if not answer:
            return f"it did not call {CLASSIFY_TOOL}"
        found = parse_classification(answer)
        if isinstance(found, Classification):
            self.understood = found
            detail = f"understood: {found.understood}; done when: {found.done}"
            self.host.emit(
                "understood", understood=found.understood, done=found.done, clear=found.clear
            )
            if found.clear:
                return found
            self.move(Phase.ASK, detail=detail)
        return found

    def _classifier_prompt(self, again: bool) -> str:
        replies = list(self.host.sub.replies)
        text = str(self.host.sub.message)
        if again:
            text = f"Classify the task again, with what the investigation found:\n{text}"
        if replies:
            text += "\n\nA person answered the question you asked: " + "\n".join(replies)
        return text

    def _ask(self, question: str) -> Finish:
        self.question = question
        self.move(Phase.WAIT_FOR_HUMAN, detail=question)
        self.host.ledger.set_outcome("handed_to_human")
        self.host.last_text = question
        self.host.emit("question", question=question)
        self.move(Phase.STOPPED)
        return Finish("completed")

    async def _side_run(
        self,
        info: ModelInfo,
        hooks: _SideHooks,
        tools: list[EngineTool],
        layer: str,
        max_tokens: int,
        prompt: str,
        context: list[dict[str, Any]],
    ) -> EngineOutcome:
        host = self.host

        async def listen(event: EngineEvent) -> None:
            if isinstance(event, MessageEnd) and event.usage is not None:
                host.add_side_usage(layer, event.usage)
            elif isinstance(event, ToolEnd):
                host.emit(
                    "side_call", layer=layer, name=event.call.name, isError=event.result.is_error
                )

        job = EngineJob(
            host.conv.id,
            info,
            "low",
            "",
            tools,
            context,
            prompt,
            max_tokens,
            run_id=host.ctx.run_id,
        )
        return await self.runner.side(job, hooks, listen)

    # ------------------------------------------------------------------ main-transcript runs

    async def _main_run(self, prompt: str | None, layer: str) -> EngineOutcome:
        """A run on the conversation's transcript, like the reactive loop's; `prompt` is added
        to the transcript first."""
        if prompt is not None:
            self.host.conv.add_message(user_text(prompt))
        self.host.token_layer = layer
        return await self.runner.main()

    def _failed(self, outcome: EngineOutcome) -> Finish | None:
        if outcome.status == "completed" or outcome.status == "ended_by_hook":
            return None
        if outcome.status == "failed" and outcome.error is not None:
            self.move(Phase.FAILED, detail=outcome.error.message)
            return Finish("failed", {"type": outcome.error.type, "message": outcome.error.message})
        self.move(Phase.STOPPED)
        return Finish("aborted", {"type": "submission_aborted", "message": "the run was aborted"})

    async def _investigate(self) -> Finish | None:
        """A read-only look: the isolation is re-read per step from the context, so writes and
        commands are refused by the policy as for a read-only session."""
        host = self.host
        self.move(Phase.INVESTIGATE)
        saved = host.ctx
        host.ctx = replace(saved, read_only=True)
        try:
            outcome = await self._main_run(
                "Investigate first, read-only (no writes, no commands); report what you find.",
                "executor",
            )
        finally:
            host.ctx = saved
        if (failed := self._failed(outcome)) is not None:
            return failed
        self.move(Phase.UNDERSTAND, detail=host.last_text[:500])
        return None

    async def _answer_run(self, route: str) -> Finish:
        """direct: the model answers, any tool call is off the path. oneTool: the first call
        that runs is the turn's one step; after it the turn is in phase answer."""
        host = self.host
        self.one_tool = route == "oneTool"
        self.collect = [] if self.one_tool else None
        outcome = await self._main_run(None, "executor")
        if (failed := self._failed(outcome)) is not None:
            return failed
        if self.machine.current is Phase.EXECUTE:  # oneTool, and the model called nothing
            self.move(Phase.CHECK, Phase.ANSWER)
        self.collect = None
        return await self._accept(host.last_text)

    def one_tool_done(self) -> None:
        """oneTool: the one call has run; what follows is the answer."""
        if self.one_tool and self.machine.current is Phase.EXECUTE:
            self.move(Phase.CHECK, Phase.ANSWER, detail="the one tool call ran")

    async def _accept(self, text: str) -> Finish:
        verdict_ = await self.host.deps.policy.after_turn(self.host.ctx, text)
        if not verdict_.accept:
            self.move(Phase.FAILED, detail=verdict_.reason)
            return Finish("failed", {"type": "turn_rejected", "message": verdict_.reason})
        if self.machine.current is not Phase.ANSWER:
            self.move(Phase.ANSWER)
        self.move(Phase.DONE)
        return Finish("completed")

    # ------------------------------------------------------------------ plans

    async def _checklist(self, forced: ForcedPlan | None) -> Finish:
        host = self.host
        conv_id = host.conv.id
        book = self.plans.get(conv_id)
        if book is None or book.state in ("Done", "Struck"):
            book = self.plans[conv_id] = PlanBook()
        self.book = book
        self.move(Phase.PLAN)
        if book.gated:
            # A person answered the gate: any reply but a refusal approves the plan.
            reply = "\n".join(host.sub.replies) or host.sub.message
            if _REFUSAL.match(reply):
                book.struck = True
                for step in book.steps:
                    step.verdict = "Struck"
                self._publish()
                self.move(Phase.FAILED, detail=f"the plan was refused: {reply[:200]}")
                return Finish("failed", {"type": "plan_refused", "message": reply[:500]})
            book.gated = False
        elif not book.opened:
            if forced is not None and forced.steps:
                book.open(list(forced.steps))
            else:
                failed = await self._plan("Plan this task as a checklist.", opening=True)
                if failed is not None:
                    return failed
            self._write_body()
            if forced is not None and forced.gate:
                book.gated = True
                self._publish()
                question = "Approve this plan? Reply to run it, or reply `no` to refuse it.\n"
                return self._ask_gate(question + book.render())
        self._publish()
        return await self._execute_plan()

    def _ask_gate(self, question: str) -> Finish:
        self.question = question
        self.move(Phase.WAIT_FOR_HUMAN, detail="the plan waits for approval")
        self.host.ledger.set_outcome("handed_to_human")
        self.host.last_text = question
        self.host.emit("question", question=question)
        self.move(Phase.STOPPED)
        return Finish("completed")

    async def _plan(self, prompt: str, *, opening: bool) -> Finish | None:
        """The planner: a side call with only the plan tools. Ends once the plan is open (or
        the step edited); a planner that cannot make one fails the turn `plan_failed`."""
        assert self.book is not None
        book = self.book
        changed: list[bool] = []

        def make(spec: ToolSpec) -> EngineTool:
            async def call(args: dict[str, Any]) -> ToolResult:
                text, is_error = book.call(spec.name, args)
                if not is_error:
                    changed.append(True)
                return ToolResult(text, is_error)

            return EngineTool(spec, call)

        def gate(call: ToolCall) -> ToolGate:
            if opening and call.name != "plan_open":
                return ToolGate(block="Open the plan with plan_open first.")
            return ALLOW

        hooks = _SideHooks(
            PLANNER_SYSTEM, gate, lambda step: bool(changed) or step >= PLANNER_STEPS
        )
        outcome = await self._side_run(
            self.host.info,
            hooks,
            [make(s) for s in PLAN_SPECS],
            "planner",
            self.host.ctx.max_output_tokens,
            prompt,
            list(self.host.conv.transcript),
        )
        if outcome.status == "failed" and outcome.error is not None:
            self.move(Phase.FAILED, detail=outcome.error.message)
            return Finish("failed", {"type": outcome.error.type, "message": outcome.error.message})
        if outcome.status == "aborted":
            self.move(Phase.STOPPED)
            return Finish("aborted", {"type": "submission_aborted", "message": "aborted"})
        if not changed:
            why = "the planner did not open a plan" if opening else "the planner changed nothing"
            if opening:
                self.move(Phase.FAILED, detail=why)
                return Finish("failed", {"type": "plan_failed", "message": why})
        return None

    def _write_body(self) -> None:
        """The runtime writes the plan's body into the transcript; the model reads it there."""
        assert self.book is not None
        body = "The plan (written by the runtime; each step is checked by a machine):\n"
        self.host.conv.add_message(user_text(body + self.book.render()))

    def _publish(self) -> None:
        assert self.book is not None
        self.host.emit("plan", plan=self.book.status())

    async def _execute_plan(self) -> Finish:
        host = self.host
        book = self.book
        assert book is not None
        total = len(book.steps)
        while (index := book.current()) is not None:
            if host.sub.sweep.done():
                self.move(Phase.STOPPED)
                return Finish(host.sub.sweep.result(), _swept(host.sub.sweep.result()))
            step = book.steps[index]
            self.move(Phase.EXECUTE, detail=f"step {index + 1}")
            self.collect = []
            outcome = await self._main_run(
                f"Step {index + 1} of {total}: {step.action}\nDo this step only; a machine checks "
                "its tool results.",
                "executor",
            )
            results, self.collect = self.collect or [], None
            if (failed := self._failed(outcome)) is not None:
                self._publish()
                return failed
            evidence = await self._evidence(evidence_commands(step.check))
            held, detail = verdict(step.check, results, evidence)
            next_ = book.record(index, held, detail)
            self.move(Phase.CHECK, detail=f"step {index + 1}: {detail}")
            host.emit("step_verdict", step=index + 1, held=held, detail=detail)
            self._publish()
            if next_ == "replan":
                self.move(Phase.PLAN, detail=f"step {index + 1} missed: replanned once")
                failed_plan = await self._plan(
                    f"Step {index + 1} ({step.action}) missed its check: {detail}. Revise step "
                    f"{index + 1} with plan_edit_step.\nThe plan:\n{book.render()}",
                    opening=False,
                )
                if failed_plan is not None:
                    return failed_plan
                replanned = f"Step {index + 1} missed its check ({detail}); replanned:\n"
                host.conv.add_message(user_text(replanned + book.render()))
            elif next_ == "strike":
                held_count = sum(1 for s in book.steps if s.verdict == "Held")
                message = (
                    f"step {index + 1} missed its check twice ({detail}); the unfinished tail "
                    f"(steps {index + 1}-{total}) is struck, {held_count} step(s) held"
                )
                host.last_text = message
                host.ledger.set_outcome("partial" if held_count else "abstain")
                self.move(Phase.FAILED, detail=message)
                return Finish("failed", {"type": "plan_struck", "message": message})
        self.move(Phase.ANSWER)
        # What the model said about its work is ignored: the answer is the checks' record.
        host.last_text = f"The plan is done: {total} of {total} steps held.\n" + book.render()
        self.move(Phase.DONE)
        return Finish("completed")

    async def _evidence(self, commands: list[str]) -> dict[str, Evidence]:
        """Evidence commands run by the runtime, never by the model: the model neither issues
        them nor sees their output before the verdict."""
        found: dict[str, Evidence] = {}
        for command in commands:
            if self.workspace is None:
                found[command] = Evidence(None, "no workspace to run evidence in")
                continue
            try:
                shell = (await self.workspace.programs()).shell
                ran = await self.workspace.run(
                    [shell, "-c", command], timeout=EVIDENCE_TIMEOUT_SECONDS, keep_bytes=65536
                )
                found[command] = Evidence(None if ran.timed_out else ran.exit_code, ran.output)
            except WorkspaceError as exc:
                found[command] = Evidence(None, str(exc))
            self.host.emit("evidence", command=command, exitCode=found[command].exit_code)
        return found

    # ------------------------------------------------------------------ the end

    def sent_back(self, reason: str) -> None:
        """The reactive loop's after-turn verdict sent the answer back: check, then execute."""
        if self.machine.current is Phase.EXECUTE:
            self.move(Phase.CHECK, detail=reason)
            self.move(Phase.EXECUTE)

    def close(self, status: str) -> None:
        """Walk the path to its end by the settlement (the reactive loop's and every early
        stop's); a path a route already ended is left as it is."""
        machine = self.machine
        if machine.over:
            return
        try:
            if status == "completed":
                if machine.current is Phase.EXECUTE:
                    self.move(Phase.CHECK)
                if machine.current is Phase.CHECK:
                    self.move(Phase.ANSWER)
                if machine.current is Phase.ANSWER:
                    self.move(Phase.DONE)
                    return
            self.move(Phase.FAILED if status == "failed" else Phase.STOPPED)
        except OffPath:  # never leave a settlement unrecorded over a phase-table question
            log.exception("closing the phase path")

    def status_fields(self) -> dict[str, Any]:
        """The settled event's own fields: the question asked, the plan."""
        fields: dict[str, Any] = {}
        if self.question is not None:
            fields["question"] = self.question
        if self.book is not None and self.book.opened:
            fields["plan"] = self.book.status()
        return fields


def _swept(status: str) -> dict[str, str] | None:
    if status == "ended":
        return None
    return {"type": "submission_aborted", "message": "the submission was swept by an abort"}
