"""The full TurnPolicy: tool list, tool decisions, the window for each call, and the verdict.

The turn calls it through the ports in `ports.py`. What the policy keeps between calls is small
and per conversation: the tool list shown this step (a call to anything else is refused), which
submissions already ran their before-turn hooks, and how often a completion was sent back.

How the turn uses the plan from `prepare_request`:
- `stop_reason` set: do not call the provider; stop the turn with that reason.
- `compaction` set: insert it into the transcript with `context.apply_compaction` (it carries
  its own position) before appending the model's answer.
- `call_only_lines`: send them with this one call (appended to `system`), never store them.

What the policy learns about the tree (path verdicts, AGENTS.md, the top-level entries) it asks
the `Workspace`, the same one the working tools act through: in a pod, the tools container.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral_api.kinds import AgentSpec

from ..context import (
    DEFAULT_TOKENIZER,
    InstructionFileCache,
    Summarizer,
    Tokenizer,
    assemble,
    fit_window,
    merge_adjacent_roles,
    resolve_budgets,
    usable_budget,
    window_for,
)
from ..context.assembly import AssembledContext, Unit
from ..context.instructions import (
    INSTRUCTION_FILE_NAME,
    MAX_FILE_BYTES,
    InstructionFile,
    instruction_units,
)
from ..context.layers import STABLE_LAYERS, LayerName
from ..context.sources import project_units, rule_units, task_units
from ..hooks import HookEvent, HookOutcome, HookRunner, Hooks, Phase, hooks_from_spec
from ..memory import (
    MemorySource,
    MemoryStore,
    extract_after_turn,
    prune_turn_records,
    recall_hook,
)
from ..ports import (
    ModelRequestPlan,
    ToolCall,
    ToolDecision,
    ToolSpec,
    TurnContext,
    TurnVerdict,
    Workspace,
    WorkspaceError,
)
from ..tools._local import LocalWorkspace
from .permissions import decide, filter_catalog
from .structured import check_schema, structured_output_errors
from .tool_search import answer_tool_search

log = logging.getLogger(__name__)

MAX_SEND_BACKS = 2
INSTRUCTION_WRITERS = frozenset({"write", "edit"})

WindowLookup = Callable[[str], int | None]
MemoryFor = Callable[[TurnContext], MemorySource | None]
TurnRecordsDir = Callable[[TurnContext], Path | None]


@dataclass(frozen=True)
class WorkspaceFacts:
    """What the context layers show of the tree, read through the workspace."""

    instruction_files: list[InstructionFile]
    branch: str | None
    entries: list[str]  # top-level names, directories with a trailing "/", .git left out


@dataclass
class _ConversationState:
    visible: list[ToolSpec] | None = None
    turns_started: set[str] = field(default_factory=set)
    send_backs: dict[str, int] = field(default_factory=dict)
    # Lines hooks gave outside before-generation (after a tool, a denial with `continue`):
    # sent with the next model call only, never stored.
    pending_lines: list[str] = field(default_factory=list)
    # An after-generation denial with `continue` the model has not been told yet, per submission.
    generation_denials: dict[str, str] = field(default_factory=dict)


def _memory_lookup(memory: MemoryStore | MemoryFor | None) -> MemoryFor:
    if isinstance(memory, MemoryStore):
        store = memory
        return lambda _ctx: store
    if memory is None:
        return lambda _ctx: None
    return memory


def memory_per_scope(db_path: str | Path) -> MemoryFor:
    """One sqlite file, one store per `TurnContext.memory_scope`; no scope means no memory."""
    stores: dict[str, MemoryStore] = {}

    def lookup(ctx: TurnContext) -> MemoryStore | None:
        if not ctx.memory_scope:
            return None
        store = stores.get(ctx.memory_scope)
        if store is None:
            store = stores[ctx.memory_scope] = MemoryStore(db_path, ctx.memory_scope)
        return store

    return lookup


def _first_turn(transcript: Sequence[dict[str, Any]]) -> bool:
    """Whether this is a conversation's first turn: its transcript holds only the task."""
    return len(transcript) == 1 and transcript[0].get("role") == "user"


def _branch(head: str | None) -> str | None:
    if head is None:
        return None
    head = head.strip()
    return head.removeprefix("ref: refs/heads/") if head.startswith("ref: ") else head[:12]


def tools_payload(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema}
        for t in tools
    ]


class CorralTurnPolicy:
    def __init__(
        self,
        *,
        granted_root: str | Path | None = None,
        workspace: Workspace | None = None,
        agent: AgentSpec | None = None,
        read_only: bool = False,
        window_lookup: WindowLookup | None = None,
        memory: MemoryStore | MemoryFor | None = None,
        hooks: Hooks | None = None,
        tokenizer: Tokenizer = DEFAULT_TOKENIZER,
        summarizer: Summarizer | None = None,
        budgets: dict[str, int] | None = None,
        business_rules: Sequence[str] = (),
        output_schema: dict[str, Any] | None = None,
        abort_on_pre_deny: bool = True,
        send_back_denied_completions: bool = True,
        turn_records_dir: TurnRecordsDir | None = None,
        instruction_cache: InstructionFileCache | None = None,
        hook_runner: HookRunner | None = None,
    ) -> None:
        if workspace is None:
            if granted_root is None:
                raise ValueError("the policy needs a workspace or a granted root")
            workspace = LocalWorkspace(granted_root)
        self.workspace = workspace
        self.agent = agent
        self.read_only = read_only
        self.window_lookup = window_lookup
        self.tokenizer = tokenizer
        self.summarizer = summarizer
        resolve_budgets(None, budgets)  # refuse a bad override now, not on the first call
        self.budgets = dict(budgets or {})
        self.business_rules = list(business_rules)
        if output_schema is not None:
            check_schema(output_schema)
        self.output_schema = output_schema
        self.abort_on_pre_deny = abort_on_pre_deny
        self.send_back_denied_completions = send_back_denied_completions
        self.turn_records_dir = turn_records_dir
        self.cache = instruction_cache or InstructionFileCache()
        self._state: dict[str, _ConversationState] = {}
        # The branch and top-level entries, read again after anything may have changed them.
        self._project: tuple[str | None, list[str]] | None = None
        # The instruction layer's units as last built: the cache hands back the same file list
        # while the tree is unchanged, and the same units object lets the trimmed layer be
        # found again without comparing 200 AGENTS.md texts (context/assembly.py).
        self._instruction_units: tuple[list[InstructionFile], str, tuple[Unit, ...]] | None = None
        self._spec_hooks: tuple[tuple[object, ...], Hooks] | None = None
        hooks = hooks or Hooks()
        self._memory_for: MemoryFor = _memory_lookup(memory)
        if memory is not None:
            # Recall runs after the caller's own before-generation hooks.
            hooks = hooks.with_handler(Phase.BEFORE_GENERATION, recall_hook(self._store_for_event))
        self.hooks = hooks
        # Runs the Agent's own hooks (`spec.hooks`), read afresh from every submission's spec.
        self.hook_runner = hook_runner
        self._current_ctx: dict[str, TurnContext] = {}

    @property
    def root(self) -> Workspace:
        """The workspace; `policy.root.root` is the granted root's path."""
        return self.workspace

    # ------------------------------------------------------------------ helpers

    def _conv(self, ctx: TurnContext) -> _ConversationState:
        return self._state.setdefault(ctx.conversation, _ConversationState())

    def _read_only(self, ctx: TurnContext) -> bool:
        return self.read_only or ctx.read_only

    def _agent(self, ctx: TurnContext | None) -> AgentSpec:
        agent = ctx.agent if ctx is not None else self.agent
        if agent is None:
            raise ValueError("no Agent spec: pass one to the policy or in the TurnContext")
        return agent

    def _store_for_event(self, event: HookEvent) -> MemorySource | None:
        ctx = self._current_ctx.get(event.conversation)
        return self._memory_for(ctx) if ctx is not None else None

    def _event(self, phase: Phase, ctx: TurnContext, **fields: Any) -> HookEvent:
        return HookEvent(
            phase=phase,
            conversation=ctx.conversation,
            submission_id=ctx.submission_id,
            **fields,
        )

    def _hooks_for(self, ctx: TurnContext) -> Hooks:
        """The Agent's hooks from this submission's spec, ahead of the policy's own."""
        if self.hook_runner is None:
            return self.hooks
        # Built once per spec (a submission's spec is one object for its whole turn), not at
        # every hook point of every step.
        key = (ctx.agent.hooks, self.hook_runner, self.hooks)
        last = self._spec_hooks
        if last is not None and all(a is b for a, b in zip(last[0], key, strict=True)):
            return last[1]
        built = hooks_from_spec(ctx.agent.hooks, self.hook_runner, base=self.hooks)
        self._spec_hooks = (key, built)
        return built

    async def run_hooks(self, phase: Phase, ctx: TurnContext, **fields: Any) -> HookOutcome:
        self._current_ctx[ctx.conversation] = ctx
        return await self._hooks_for(ctx).run(self._event(phase, ctx, **fields))

    def _queue_lines(self, ctx: TurnContext, *lines: str) -> None:
        self._conv(ctx).pending_lines.extend(line for line in lines if line)

    # ------------------------------------------------------------------ assembly

    async def workspace_facts(self) -> WorkspaceFacts:
        """AGENTS.md files, the branch and the top-level entries: cached until a tool or a new
        turn may have changed them, then read again in one survey of the workspace."""
        root = self.workspace.root
        files = self.cache.fresh(root)
        if files is not None and self._project is not None:
            return WorkspaceFacts(files, *self._project)
        known = self.cache.fingerprints(root)
        # The project facts were read with the files: their generation vouches for both.
        since = self.cache.generation(root) if self._project is not None else 0
        asked_at = time.time_ns()  # the clock of the files' mtimes (the node's, in a pod)
        try:
            survey = await self.workspace.survey(
                INSTRUCTION_FILE_NAME, known, MAX_FILE_BYTES, since=since
            )
        except WorkspaceError as exc:
            # The tools container is away (restarting): this call goes with what was last seen,
            # and the next one asks again.
            log.warning("the workspace could not be surveyed: %s", exc)
            return WorkspaceFacts(self.cache.last(root), *(self._project or (None, [])))
        if survey.unchanged and self._project is not None:
            return WorkspaceFacts(self.cache.confirm(root, survey.generation), *self._project)
        files = self.cache.update(root, survey.files, asked_at, survey.generation)
        entries = sorted(
            e.name + ("/" if e.kind == "dir" else "") for e in survey.entries if e.name != ".git"
        )
        self._project = (_branch(survey.git_head), entries)
        return WorkspaceFacts(files, *self._project)

    def assemble_context(
        self,
        transcript: Sequence[dict[str, Any]],
        ctx: TurnContext | None = None,
        *,
        budgets: dict[str, int] | None = None,
        facts: WorkspaceFacts | None = None,
    ) -> AssembledContext:
        """The five layers for this call, as the turn sends them (also `corral context`).

        Without `facts` (a caller outside any event loop, like `corral context`) they are read
        through the workspace here."""
        if facts is None:
            facts = asyncio.run(self.workspace_facts())
        agent = self._agent(ctx)
        read_only = self.read_only or (ctx.read_only if ctx else False)
        root = self.workspace.root
        contents = {
            LayerName.IDENTITY: [Unit("agent:identity", agent.identity, header=False)],
            LayerName.INSTRUCTION_FILES: self._instruction_layer(
                facts.instruction_files, agent.instructions
            ),
            LayerName.PROJECT_CONTEXT: project_units(root, facts.branch, facts.entries),
            LayerName.BUSINESS_RULES: rule_units(
                root, read_only=read_only, extra=self.business_rules
            ),
            LayerName.TASK_STATE: task_units(transcript),
        }
        layer_budgets = resolve_budgets(agent.budgets, {**self.budgets, **(budgets or {})})
        return assemble(contents, layer_budgets, tokenizer=self.tokenizer)

    def _instruction_layer(
        self, files: list[InstructionFile], agent_instructions: str
    ) -> tuple[Unit, ...]:
        last = self._instruction_units
        if last is not None and last[0] is files and last[1] == agent_instructions:
            return last[2]
        units = tuple(instruction_units(files, agent_instructions))
        self._instruction_units = (files, agent_instructions, units)
        return units

    # ------------------------------------------------------------------ TurnPolicy

    def visible_tools(self, ctx: TurnContext, catalog: list[ToolSpec]) -> list[ToolSpec]:
        agent = self._agent(ctx)
        shown = filter_catalog(
            catalog, agent.tools.allow, agent.tools.deny, read_only=self._read_only(ctx)
        )
        self._conv(ctx).visible = shown
        return shown

    def answer_tool_search(self, ctx: TurnContext, tool_input: dict[str, Any]) -> str:
        """Execute the tool-search tool against the list shown to the model this step."""
        return answer_tool_search(tool_input, self._conv(ctx).visible or [])

    async def decide_tool(self, ctx: TurnContext, call: ToolCall) -> ToolDecision:
        outcome = await self.run_hooks(
            Phase.BEFORE_TOOL, ctx, tool_name=call.name, tool_input=dict(call.input)
        )
        self._queue_lines(ctx, *outcome.lines)
        if outcome.denied:
            # `continue: true` blocks the call alone; the model reads the reason and goes on.
            aborts = self.abort_on_pre_deny and outcome.proceed is not True
            return ToolDecision("deny", f"hook denied: {outcome.reason}", abort_turn=aborts)
        effective = outcome.tool_input if outcome.tool_input is not None else call.input
        agent = self._agent(ctx)
        decision = await decide(
            ToolCall(call.id, call.name, effective),
            allow=agent.tools.allow,
            deny=agent.tools.deny,
            visible=self._conv(ctx).visible,
            read_only=self._read_only(ctx),
            root=self.workspace,
        )
        if outcome.tool_input is not None and decision.outcome != "deny":
            return ToolDecision(decision.outcome, decision.reason, input=effective)
        return decision

    async def prepare_request(
        self, ctx: TurnContext, transcript: list[dict[str, Any]]
    ) -> ModelRequestPlan:
        conv = self._conv(ctx)
        if ctx.submission_id not in conv.turns_started:
            conv.turns_started.add(ctx.submission_id)
            # Between turns anyone may have changed the tree (a person, git): rescan once.
            self._tree_changed()
            if _first_turn(transcript):
                opened = await self.session_start(ctx)
                if stop := self._pre_denial(ctx, opened, "session-start"):
                    return stop
            started = await self.run_hooks(Phase.BEFORE_TURN, ctx, messages=tuple(transcript))
            if stop := self._pre_denial(ctx, started, "before-turn"):
                return stop
        assembled = self.assemble_context(transcript, ctx, facts=await self.workspace_facts())
        before = await self.run_hooks(
            Phase.BEFORE_GENERATION, ctx, system=assembled.prompt, messages=tuple(transcript)
        )
        if before.denied and self.abort_on_pre_deny and before.proceed is not True:
            return ModelRequestPlan(
                system=assembled.prompt,
                messages=[],
                stop_reason=f"before-generation hook denied: {before.reason}",
                stop_error="hook_denied",
                layer_tokens=assembled.layer_tokens(),
            )
        if before.denied:
            self._queue_lines(ctx, f"A before-generation hook objected: {before.reason}")
        system = before.system if before.system is not None else assembled.prompt
        # What hooks said since the last call goes with this one, then is forgotten.
        lines = [*conv.pending_lines, *before.lines]
        conv.pending_lines.clear()
        conv.generation_denials.pop(ctx.submission_id, None)
        tools = tools_payload(conv.visible or [])
        fixed = (
            self.tokenizer.count(system)
            + self.tokenizer.count("\n".join(lines))
            + self.tokenizer.count(json.dumps(tools, ensure_ascii=False))
        )
        window = window_for(ctx.model, self.window_lookup, ctx.context_window)
        fit = await fit_window(
            transcript,
            fixed_tokens=fixed,
            budget=usable_budget(window, ctx.max_output_tokens),
            tokenizer=self.tokenizer,
            summarizer=self.summarizer,
        )
        layer_tokens = {**assembled.layer_tokens(), "messages": fit.tokens - fixed}
        if fit.stop_reason:
            return ModelRequestPlan(
                system=system, messages=[], stop_reason=fit.stop_reason, layer_tokens=layer_tokens
            )
        return ModelRequestPlan(
            system=system,
            messages=merge_adjacent_roles(fit.messages),
            call_only_lines=lines,
            compaction=fit.compaction,
            layer_tokens=layer_tokens,
            # A prompt a hook replaced has no layers the policy can vouch for.
            stable_system=assembled.leading_sections(STABLE_LAYERS)
            if before.system is None
            else (),
        )

    async def after_tool(
        self, ctx: TurnContext, call: ToolCall, result: str, is_error: bool
    ) -> None:
        # A tool may have changed an AGENTS.md; the next assembly must see it.
        if call.name == "bash":
            # The workspace scanned what the command left: unless that moved the survey
            # generation, the cached files and project facts still hold.
            generation = self.workspace.survey_generation(INSTRUCTION_FILE_NAME)
            self.cache.command_ran(self.workspace.root, generation)
        elif call.name in INSTRUCTION_WRITERS:
            # A new top-level entry or an AGENTS.md: the survey's generation tells which.
            self._tree_changed()
        outcome = await self.run_hooks(
            Phase.AFTER_TOOL,
            ctx,
            tool_name=call.name,
            tool_input=dict(call.input),
            tool_result=result,
            tool_is_error=is_error,
        )
        # The call already ran: what a hook says about it (a lint finding, a denial's reason)
        # reaches the model with its next request.
        self._queue_lines(ctx, *outcome.lines)
        if outcome.denied:
            self._queue_lines(ctx, f"A hook objected to that {call.name} call: {outcome.reason}")

    def _tree_changed(self) -> None:
        """Anything may have changed: survey again (answered "unchanged" when nothing did)."""
        self.cache.invalidate(self.workspace.root)

    async def after_generation(self, ctx: TurnContext, message: dict[str, Any]) -> HookOutcome:
        """Optional: the turn may call this with each model answer.

        A denial stops the run, unless the hook said `continue`: then the model hears the
        reason with its next request, or, when this answer ends the run, the turn goes back."""
        outcome = await self.run_hooks(Phase.AFTER_GENERATION, ctx, messages=(message,))
        self._queue_lines(ctx, *outcome.lines)
        if outcome.denied and outcome.proceed is True:
            self._queue_lines(ctx, f"A hook objected to your last answer: {outcome.reason}")
            self._conv(ctx).generation_denials[ctx.submission_id] = outcome.reason
            return dataclasses.replace(outcome, denied=False)
        return outcome

    async def after_turn(self, ctx: TurnContext, final_text: str) -> TurnVerdict:
        reasons: list[str] = []
        if self.output_schema is not None:
            errors = structured_output_errors(final_text, self.output_schema)
            if errors:
                reasons.append("structured output is not valid: " + "; ".join(errors[:5]))
        conv = self._conv(ctx)
        objection = conv.generation_denials.pop(ctx.submission_id, None)
        if objection is not None:
            reasons.append(f"after-generation hook denied: {objection}")
        if not reasons:
            outcome = await self.run_hooks(Phase.AFTER_TURN, ctx, final_text=final_text)
            if outcome.denied:
                reasons.append(f"after-turn hook denied: {outcome.reason}")
                if outcome.proceed is False:
                    # A spec hook without `continue`: the turn ends here, not sent back.
                    conv.pending_lines.clear()
                    self._prune(ctx)
                    return TurnVerdict(accept=False, reason=reasons[-1], stop=True)
            conv.pending_lines.extend(outcome.lines)
        if not reasons:
            self._prune(ctx)
            # Accepted: memory may learn from the answer (the custodian decides; fail-open).
            await extract_after_turn(self._memory_for(ctx), final_text, ctx.submission_id)
            return TurnVerdict(accept=True)
        reason = "; ".join(reasons)
        sent = conv.send_backs.get(ctx.submission_id, 0)
        if not self.send_back_denied_completions or sent >= MAX_SEND_BACKS:
            self._prune(ctx)
            return TurnVerdict(
                accept=False, reason=f"{reason} (sent back {sent} times; stopping)", stop=True
            )
        conv.send_backs[ctx.submission_id] = sent + 1
        return TurnVerdict(accept=False, reason=reason)

    # ------------------------------------------------------------------ session

    async def session_start(self, ctx: TurnContext) -> HookOutcome:
        return await self.run_hooks(Phase.SESSION_START, ctx)

    async def session_end(self, ctx: TurnContext, phase: str | None = None) -> HookOutcome:
        """The session is over (the wire's `end`); `phase` is the Session's final phase."""
        outcome = await self.run_hooks(
            Phase.SESSION_END, ctx, extra={"sessionPhase": phase} if phase else {}
        )
        self._state.pop(ctx.conversation, None)
        self._current_ctx.pop(ctx.conversation, None)
        return outcome

    def _pre_denial(
        self, ctx: TurnContext, outcome: HookOutcome, what: str
    ) -> ModelRequestPlan | None:
        """A session-start or before-turn denial: the plan that stops the turn, or None when
        it does not (allowed, `continue: true`, or the policy does not abort on denials)."""
        if not outcome.denied:
            self._queue_lines(ctx, *outcome.lines)
            return None
        if self.abort_on_pre_deny and outcome.proceed is not True:
            return ModelRequestPlan(
                system="",
                messages=[],
                stop_reason=f"{what} hook denied: {outcome.reason}",
                stop_error="hook_denied",
            )
        self._queue_lines(ctx, *outcome.lines, f"A {what} hook objected: {outcome.reason}")
        return None

    def _prune(self, ctx: TurnContext) -> None:
        if self.turn_records_dir is None:
            return
        try:
            directory = self.turn_records_dir(ctx)
            if directory is not None:
                prune_turn_records(directory)
        except OSError:
            log.exception("pruning turn records failed")
