"""The tool loop every engine adapter shares; an adapter adds only its transport.

The loop keeps the seam's rules (order of events and hooks, one call at a time, abort, steer,
partial message on a cut or a failure) and the provider-call rules: a call is retried (default
2, growing backoff, or the server's `retry-after`, capped) only while nothing has been forwarded
to the turn, and a budget refusal never; a silent stream (default 120 s) and a stream past its
cap (default 300 s) fail without retry. A `pause_turn` answer is sent back for the model to go
on; a tool call whose input was cut off (max_tokens) is answered as not run, never run with a
guessed input. Every request marks its stable prefixes for the provider's prompt cache
(`caching.py`) unless the settings say not to. An adapter implements `_stream_once`:
send one request, feed every stream event to the builder, and raise `StreamFailure` with the
error type and whether a retry may help. Both adapters (`anthropic_engine`, `lean_engine`) are
held to the same conformance tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from corral_common.catalog import thinking_param

from ..ports import ToolCall
from ..telemetry import RUN_ID_HEADER
from ..tools import ToolResult
from ._accumulate import MessageBuilder
from .caching import with_breakpoints
from .messages import tool_result_block, tool_results_message, user_text
from .schema import check_arguments
from .seam import (
    EngineError,
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
    ToolStart,
)

INTERRUPTED = "This call was interrupted: the turn was aborted while it ran."
CUT_OFF = (
    "This call did not run: the answer stopped ({stop_reason}) before the call's input was "
    "complete. Call it again with the whole input."
)
RETRYABLE_STATUS = frozenset({408, 409, 429})
# A spent budget is refused again on every try, whatever the headers say.
NEVER_RETRIED = frozenset({"budget_exceeded_error"})
# The longest wait a `retry-after` gets (a longer ask waits this long, then tries again): half
# the stream's silence limit (120 s), so a refusal never idles a turn longer than a silent model.
RETRY_AFTER_CAP_SECONDS = 60.0


@dataclass(frozen=True)
class EngineSettings:
    base_url: str | None = None
    api_key: str = "corral-no-key"  # the custodian adds the real key; the harness has none
    retries: int = 2
    backoff_seconds: float = 1.0
    idle_seconds: float = 120.0
    stream_cap_seconds: float = 300.0
    cache_breakpoints: bool = True  # mark stable prefixes for the prompt cache (`caching.py`)


class StreamFailure(Exception):
    """One provider call failed; `kind` is the settlement's error type."""

    def __init__(
        self, kind: str, message: str, *, retryable: bool, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after  # seconds the server asked for before another try
        self.builder: MessageBuilder | None = None  # what the failed attempt had streamed


class _Cut(Exception):
    """The generation was aborted; carries what had streamed."""

    def __init__(self, builder: MessageBuilder) -> None:
        super().__init__("aborted")
        self.builder = builder


def retryable_status(status: int, should_retry: str | None, kind: str = "") -> bool:
    """The server's `x-should-retry` decides when it says (the custodian says `false` for a
    spent budget or a refused model: a retry would only be refused again); else the status.
    Status 200 is an `error` event inside a stream that had begun. A budget refusal is never
    retried."""
    if kind in NEVER_RETRIED:
        return False
    said = (should_retry or "").strip().lower()
    if said in ("true", "false"):
        return said == "true"
    return status in RETRYABLE_STATUS or status >= 500 or status == 200


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait a refusal asks for: `retry-after-ms` (milliseconds), else `retry-after`
    (seconds, or an HTTP date); None when neither says a usable one."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = (headers.get(name) or "").strip()
        if not value:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                continue
            seconds = when.timestamp() - time.time()
        if seconds == seconds and seconds >= 0:  # not NaN
            return seconds
    return None


def check_finished(builder: MessageBuilder) -> None:
    """A stream that ended without an error event: it failed if an event was not JSON, or if
    it stopped before message_stop."""
    if builder.undecodable:
        raise StreamFailure(
            "model_error",
            f"the model stream sent an event that is not JSON: {builder.undecodable[0][:200]!r}",
            retryable=True,
        )
    if not builder.finished:
        raise StreamFailure(
            "stream_truncated", "the model stream ended before message_stop", retryable=True
        )


@contextlib.asynccontextmanager
async def stream_clock(settings: EngineSettings) -> AsyncIterator[Any]:
    """One timer for the whole stream; `tick()` it at every event. The stream fails when it is
    silent for idle_seconds or runs past its cap, whichever comes first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.stream_cap_seconds

    def tick() -> None:
        timer.reschedule(min(deadline, loop.time() + settings.idle_seconds))

    try:
        async with asyncio.timeout(None) as timer:
            tick()
            yield tick
    except TimeoutError:
        if loop.time() >= deadline - 0.001:
            raise StreamFailure(
                "stream_timeout",
                f"the model stream ran past its cap of {settings.stream_cap_seconds:g} s",
                retryable=False,
            ) from None
        raise StreamFailure(
            "stream_silent",
            f"the model stream was silent for {settings.idle_seconds:g} s",
            retryable=False,
        ) from None


def request_params(
    job: EngineJob,
    tools: dict[str, EngineTool],
    system: str,
    messages: list[dict[str, Any]],
    *,
    stable_system: tuple[str, ...] = (),
    breakpoints: bool = False,
) -> dict[str, Any]:
    """The Messages API request body of one generation; with `breakpoints`, its stable
    prefixes marked for the prompt cache."""
    params: dict[str, Any] = {
        "model": job.model.name,
        "max_tokens": job.max_output_tokens,
        "messages": messages,
        "metadata": {"user_id": job.conversation},
        "thinking": thinking_param(job.model, job.thinking_level, job.max_output_tokens),
        "stream": True,
    }
    if system:
        params["system"] = system
    if tools:
        params["tools"] = [
            {
                "name": t.spec.name,
                "description": t.spec.description,
                "input_schema": t.spec.input_schema,
            }
            for t in tools.values()
        ]
    return with_breakpoints(params, stable_system) if breakpoints else params


class StreamingEngine:
    """Runs one submission's tool loop against the Messages API; subclasses send the requests."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self._aborted = asyncio.Event()
        self._steering: list[str] = []
        self._inflight: asyncio.Task[Any] | None = None
        # Sent with every model request: the custodian logs the run id the traces carry.
        self.headers: dict[str, str] = {}

    @classmethod
    def prepare(cls, settings: EngineSettings) -> None:
        """Called once in the event loop when the adapter is loaded, before any turn: work done
        here (a connection pool, its TLS context) is off the first request's path."""

    async def _stream_once(self, params: dict[str, Any], builder: MessageBuilder) -> None:
        raise NotImplementedError

    def steer(self, text: str) -> None:
        self._steering.append(text)

    def abort(self) -> None:
        self._aborted.set()
        if self._inflight is not None:
            self._inflight.cancel()

    async def run(self, job: EngineJob, hooks: EngineHooks, listener: Listener) -> EngineOutcome:
        tools = {t.spec.name: t for t in job.tools}
        messages: list[dict[str, Any]] = [*job.context]
        if job.prompt is not None:
            messages.append(user_text(job.prompt))
        if job.run_id:
            self.headers = {RUN_ID_HEADER: job.run_id}
        step = 0
        while True:
            if self._aborted.is_set():
                return EngineOutcome("aborted", steps=step)
            while self._steering:
                messages.append(user_text(self._steering.pop(0)))
            try:
                plan = await hooks.before_request(await hooks.convert_messages(messages))
            except StopRun as stop:
                return EngineOutcome(
                    "failed", EngineError(stop.error_type, stop.reason), steps=step
                )
            try:
                builder = await self._generate(job, tools, plan)
            except _Cut as cut:
                partial = cut.builder.partial_message()
                await listener(MessageEnd(partial, "aborted", cut.builder.final_usage()))
                calls = _calls(partial)
                return EngineOutcome("aborted", unanswered=calls, steps=step)
            except StreamFailure as failure:
                left = await _record_failed(failure, listener)
                error = EngineError(failure.kind, failure.message)
                return EngineOutcome("failed", error, unanswered=left, steps=step)
            message = builder.message()
            messages.append(message)
            await listener(MessageEnd(message, builder.stop_reason, builder.final_usage()))
            calls = _calls(message)
            if not calls and builder.stop_reason == "pause_turn":
                continue  # the next request sends the paused answer back for the model to go on
            if not calls:
                return EngineOutcome("completed", steps=step)
            cut_off = builder.cut_calls()
            results: list[dict[str, Any]] = []
            unanswered: list[ToolCall] = []
            for index, call in enumerate(calls):
                if not self._aborted.is_set():
                    await listener(ToolStart(call))
                if self._aborted.is_set():
                    unanswered = calls[index:]
                    break
                if call.id in cut_off:
                    result = ToolResult(CUT_OFF.format(stop_reason=builder.stop_reason), True)
                else:
                    result = await self._one_call(call, tools, hooks)
                results.append(tool_result_block(call.id, result.content, result.is_error))
                await listener(ToolEnd(call, result))
            messages.append(tool_results_message(results))
            if self._aborted.is_set():
                return EngineOutcome("aborted", unanswered=unanswered, steps=step)
            step += 1
            await listener(StepBoundary(step))
            if hooks.ends_run(step):
                return EngineOutcome("ended_by_hook", steps=step)

    async def _one_call(
        self, call: ToolCall, tools: dict[str, EngineTool], hooks: EngineHooks
    ) -> ToolResult:
        tool = tools.get(call.name)
        if tool is None:
            return ToolResult(f"There is no tool named {call.name!r} in this turn.", True)
        problem = check_arguments(tool.spec.input_schema, call.input)
        if problem:
            return ToolResult(f"Invalid arguments for {call.name}: {problem}.", True)
        gate = await hooks.before_tool_call(call)
        if gate.block is not None:
            if gate.abort:
                self.abort()
            return ToolResult(gate.block, True)
        task = asyncio.ensure_future(
            tool.execute(gate.input if gate.input is not None else call.input)
        )
        self._inflight = task
        try:
            return await task
        except asyncio.CancelledError:
            if not self._aborted.is_set():
                raise
            return ToolResult(INTERRUPTED, True)
        finally:
            self._inflight = None

    async def _generate(
        self, job: EngineJob, tools: dict[str, EngineTool], plan: RequestPlan
    ) -> MessageBuilder:
        params = request_params(
            job,
            tools,
            plan.system,
            plan.messages,
            stable_system=plan.stable_system,
            breakpoints=self.settings.cache_breakpoints,
        )
        attempt = 0
        while True:
            # An abort that came while the request was prepared (the hooks await, and nothing
            # is in flight for abort() to cancel) must not start one: it would run to its end.
            if self._aborted.is_set():
                raise _Cut(MessageBuilder())
            builder = MessageBuilder()
            asked: float | None = None
            task = asyncio.ensure_future(self._stream_once(params, builder))
            self._inflight = task
            try:
                await task
                return builder
            except asyncio.CancelledError:
                if self._aborted.is_set():
                    raise _Cut(builder) from None
                raise
            except StreamFailure as failure:
                failure.builder = builder
                if not failure.retryable or builder.forwarded or attempt >= self.settings.retries:
                    raise
                asked = failure.retry_after
            finally:
                self._inflight = None
            attempt += 1
            delay = self.settings.backoff_seconds * (2 ** (attempt - 1))
            if asked is not None:
                delay = min(asked, RETRY_AFTER_CAP_SECONDS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._aborted.wait(), delay)
            if self._aborted.is_set():
                raise _Cut(MessageBuilder())


async def _record_failed(failure: StreamFailure, listener: Listener) -> list[ToolCall]:
    """A failed stream's partial answer and usage go to the record as an aborted one's do (the
    tokens were spent, the text was seen); its whole tool calls are left unanswered."""
    builder = failure.builder
    if builder is None:
        return []
    partial = builder.partial_message()
    usage = builder.final_usage()
    if partial["content"] or usage is not None:
        await listener(MessageEnd(partial, "error", usage))
    return _calls(partial)


def _calls(message: dict[str, Any]) -> list[ToolCall]:
    return [
        ToolCall(b["id"], b["name"], b["input"] if isinstance(b.get("input"), dict) else {})
        for b in message["content"]
        if b.get("type") == "tool_use"
    ]
