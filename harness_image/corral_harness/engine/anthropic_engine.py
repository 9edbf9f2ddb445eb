"""The engine adapter on the official `anthropic` SDK (AsyncAnthropic, streaming).

This is the only module that imports the SDK. Importing it costs seconds, so the server loads
this module in the background after it starts listening (see `server.py`).

Provider calls retry (default 2, growing backoff) only while nothing has been forwarded to the
turn; a silent stream (default 120 s) fails without retry; the whole stream is capped (default
300 s). The SDK's own retries are off so that this rule is the only one.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import anthropic
from anthropic.types import RawMessageStreamEvent

from corral_common.catalog import thinking_param

from ..seams import ToolCall
from ..tools import ToolResult
from ._accumulate import MessageBuilder
from .messages import tool_result_block, user_text
from .schema import check_arguments
from .seam import (
    EngineError,
    EngineHooks,
    EngineJob,
    EngineOutcome,
    EngineTool,
    Listener,
    MessageEnd,
    StepBoundary,
    StopRun,
    ToolEnd,
    ToolStart,
)

_RETRYABLE_STATUS = {408, 409, 429}
# The stream's event union; a typing special form, so mypy sees it as Any.
_EVENT: Any = RawMessageStreamEvent
INTERRUPTED = "This call was interrupted: the turn was aborted while it ran."


@dataclass(frozen=True)
class EngineSettings:
    base_url: str | None = None
    api_key: str = "corral-no-key"  # the custodian adds the real key; the harness has none
    retries: int = 2
    backoff_seconds: float = 1.0
    idle_seconds: float = 120.0
    stream_cap_seconds: float = 300.0


class _Failure(Exception):
    def __init__(self, kind: str, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retryable = retryable


class _Cut(Exception):
    """The generation was aborted; carries what had streamed."""

    def __init__(self, builder: MessageBuilder) -> None:
        super().__init__("aborted")
        self.builder = builder


# One client (one connection pool) per event loop and endpoint, reused across submissions.
_clients: dict[tuple[int, str | None, str], anthropic.AsyncAnthropic] = {}


def _client(settings: EngineSettings) -> anthropic.AsyncAnthropic:
    key = (id(asyncio.get_running_loop()), settings.base_url, settings.api_key)
    client = _clients.get(key)
    if client is None:
        client = anthropic.AsyncAnthropic(
            api_key=settings.api_key,
            base_url=settings.base_url,
            max_retries=0,
            timeout=settings.stream_cap_seconds,
        )
        _clients[key] = client
    return client


class AnthropicEngine:
    """Runs one submission's tool loop against the Messages API."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self._aborted = asyncio.Event()
        self._steering: list[str] = []
        self._inflight: asyncio.Task[Any] | None = None

    def steer(self, text: str) -> None:
        self._steering.append(text)

    def abort(self) -> None:
        self._aborted.set()
        if self._inflight is not None:
            self._inflight.cancel()

    async def run(self, job: EngineJob, hooks: EngineHooks, listener: Listener) -> EngineOutcome:
        tools = {t.spec.name: t for t in job.tools}
        messages: list[dict[str, Any]] = [*job.context, user_text(job.prompt)]
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
                builder = await self._generate(job, tools, plan.system, plan.messages)
            except _Cut as cut:
                partial = cut.builder.partial_message()
                await listener(MessageEnd(partial, "aborted", cut.builder.final_usage()))
                calls = _calls(partial)
                return EngineOutcome("aborted", unanswered=calls, steps=step)
            except _Failure as failure:
                return EngineOutcome(
                    "failed", EngineError(failure.kind, failure.message), steps=step
                )
            message = builder.message()
            messages.append(message)
            await listener(MessageEnd(message, builder.stop_reason, builder.final_usage()))
            calls = _calls(message)
            if not calls:
                return EngineOutcome("completed", steps=step)
            results: list[dict[str, Any]] = []
            unanswered: list[ToolCall] = []
            for index, call in enumerate(calls):
                if not self._aborted.is_set():
                    await listener(ToolStart(call))
                if self._aborted.is_set():
                    unanswered = calls[index:]
                    break
                result = await self._one_call(call, tools, hooks)
                results.append(tool_result_block(call.id, result.content, result.is_error))
                await listener(ToolEnd(call, result))
            messages.append({"role": "user", "content": results})
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
        self,
        job: EngineJob,
        tools: dict[str, EngineTool],
        system: str,
        messages: list[dict[str, Any]],
    ) -> MessageBuilder:
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
        attempt = 0
        while True:
            # An abort that came while the request was prepared (the hooks await, and nothing
            # is in flight for abort() to cancel) must not start one: it would run to its end.
            if self._aborted.is_set():
                raise _Cut(MessageBuilder())
            builder = MessageBuilder()
            task = asyncio.ensure_future(self._stream_once(params, builder))
            self._inflight = task
            try:
                await task
                return builder
            except asyncio.CancelledError:
                if self._aborted.is_set():
                    raise _Cut(builder) from None
                raise
            except _Failure as failure:
                if not failure.retryable or builder.forwarded or attempt >= self.settings.retries:
                    raise
            finally:
                self._inflight = None
            attempt += 1
            delay = self.settings.backoff_seconds * (2 ** (attempt - 1))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._aborted.wait(), delay)
            if self._aborted.is_set():
                raise _Cut(MessageBuilder())

    async def _stream_once(self, params: dict[str, Any], builder: MessageBuilder) -> None:
        settings = self.settings
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.stream_cap_seconds
        client = _client(settings)
        try:
            # One timer for the whole stream, pushed forward at every event: the stream fails
            # when it is silent for idle_seconds or runs past its cap, whichever comes first.
            async with asyncio.timeout(None) as timer:
                timer.reschedule(min(deadline, loop.time() + settings.idle_seconds))
                # `post` is the SDK's own request path for /v1/messages; `messages.create` would
                # first re-walk every message of the transcript through its type transform on
                # every request, a cost that grows with the turn.
                stream = await client.post(
                    "/v1/messages",
                    body=params,
                    cast_to=_EVENT,
                    stream=True,
                    stream_cls=anthropic.AsyncStream[_EVENT],
                )
                try:
                    async for event in stream:
                        timer.reschedule(min(deadline, loop.time() + settings.idle_seconds))
                        builder.on_event(event)
                finally:
                    with contextlib.suppress(Exception):
                        await stream.close()
        except TimeoutError:
            if loop.time() >= deadline - 0.001:
                raise _Failure(
                    "stream_timeout",
                    f"the model stream ran past its cap of {settings.stream_cap_seconds:g} s",
                    retryable=False,
                ) from None
            raise _Failure(
                "stream_silent",
                f"the model stream was silent for {settings.idle_seconds:g} s",
                retryable=False,
            ) from None
        except anthropic.APIStatusError as exc:
            status = exc.status_code
            raise _Failure(
                _error_type(exc),
                f"model error {status}: {_error_message(exc)}",
                retryable=_retryable(exc),
            ) from None
        except anthropic.APIConnectionError as exc:
            raise _Failure(
                "connection_error", f"model connection failed: {exc}", retryable=True
            ) from None
        if not builder.finished:
            raise _Failure(
                "stream_truncated", "the model stream ended before message_stop", retryable=True
            )


def _retryable(exc: anthropic.APIStatusError) -> bool:
    """The server's `x-should-retry` decides when it says (the custodian says `false` for a
    spent budget or a refused model: a retry would only be refused again); else the status."""
    said = exc.response.headers.get("x-should-retry", "").strip().lower()
    if said in ("true", "false"):
        return said == "true"
    status = exc.status_code
    return status in _RETRYABLE_STATUS or status >= 500 or _mid_stream(exc)


def _mid_stream(exc: anthropic.APIStatusError) -> bool:
    # An `error` event inside a 200 response: the provider failed after the stream began.
    return exc.status_code == 200


def _error_type(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("type"), str):
            return str(err["type"])
    return "model_error"


def _error_message(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
    return str(exc)


def _calls(message: dict[str, Any]) -> list[ToolCall]:
    return [
        ToolCall(b["id"], b["name"], b["input"] if isinstance(b.get("input"), dict) else {})
        for b in message["content"]
        if b.get("type") == "tool_use"
    ]
