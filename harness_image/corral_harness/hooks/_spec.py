"""Hooks from `Agent.spec.hooks`: the event each hook is given and what its answer means.

Pure: a `HookRunner` (an adapter: a process in the harness, one in the tools container, or a
POST through the custodian) does the running and hands back a `HookReply`; this module builds
the handlers, matches tool names, applies timeouts and `onError`, and reads the answer.

The answer contract (docs/hooks.md), the same for a command's stdout and an http body:

- nothing (empty stdout or body) or `{}`: allow.
- a JSON object: `decision` ("allow" | "deny"; "block" is read as "deny", as in Claude Code),
  `reason`, `continue` (true: a denial does not abort the turn), `updatedInput` (beforeTool:
  the call runs with this input instead), `additionalContext` (a string or a list of strings:
  lines the model sees with its next request only, never stored in the transcript).
- a command's exit code 2: deny, with its stderr as the reason. Any other non-zero exit, a
  timeout, or an answer that is not a JSON object is a failure, and `onError` decides.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from corral_api.hook_spec import TOOL_PHASES, AgentHooks, HookSpec
from corral_common.toolmatch import matches

from ._hooks import HookEvent, HookHandler, HookResult, Hooks, Phase

log = logging.getLogger(__name__)

# Spec phase name -> the harness's phase.
SPEC_PHASES: Mapping[str, Phase] = {
    "sessionStart": Phase.SESSION_START,
    "beforeTurn": Phase.BEFORE_TURN,
    "beforeGeneration": Phase.BEFORE_GENERATION,
    "afterGeneration": Phase.AFTER_GENERATION,
    "beforeTool": Phase.BEFORE_TOOL,
    "afterTool": Phase.AFTER_TOOL,
    "afterTurn": Phase.AFTER_TURN,
    "sessionEnd": Phase.SESSION_END,
}
PHASE_NAMES: Mapping[Phase, str] = {phase: name for name, phase in SPEC_PHASES.items()}

MAX_EVENT_TEXT = 64 * 1024  # a tool result or answer is cut to this many characters
MAX_REASON = 2000
RUNNER_GRACE_SECONDS = 5.0  # the runner enforces the timeout; this is the backstop


@dataclass(frozen=True)
class HookReply:
    """What a runner got back. `kind`: an answer to read, a denial (exit 2), or a failure."""

    kind: Literal["answer", "denied", "failed"]
    body: str = ""  # the answer's text (stdout, http body)
    reason: str = ""  # the denial's reason (stderr) or what failed


class HookRunner(Protocol):
    async def run(
        self, hook: HookSpec, phase: str, payload: dict[str, Any], timeout: float
    ) -> HookReply: ...


class BadAnswer(ValueError):
    """A hook's answer does not follow the contract."""


def _cut(text: str, limit: int = MAX_EVENT_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[... cut at {limit} characters]"


def event_payload(hook: HookSpec, event: HookEvent) -> dict[str, Any]:
    """What the hook is given (stdin JSON, http body): the call, never the transcript."""
    phase = PHASE_NAMES[event.phase]
    payload: dict[str, Any] = {
        "hook": hook.name,
        "phase": phase,
        "conversation": event.conversation,
        "submissionId": event.submission_id,
    }
    if phase in TOOL_PHASES:
        payload["toolName"] = event.tool_name
        payload["toolInput"] = dict(event.tool_input)
    if event.phase is Phase.AFTER_TOOL:
        payload["toolResult"] = _cut(event.tool_result)
        payload["toolIsError"] = event.tool_is_error
    if event.phase is Phase.AFTER_GENERATION and event.messages:
        answer = event.messages[-1]
        payload["answer"] = {
            "text": _cut(
                "".join(b.get("text", "") for b in answer.get("content", []) if _is_text(b))
            ),
            "toolCalls": [
                {"name": b.get("name"), "input": b.get("input")}
                for b in answer.get("content", [])
                if isinstance(b, dict) and b.get("type") == "tool_use"
            ],
        }
    if event.phase is Phase.AFTER_TURN:
        payload["finalText"] = _cut(event.final_text)
    if event.phase in (Phase.BEFORE_TURN, Phase.BEFORE_GENERATION):
        payload["messageCount"] = len(event.messages)
    if event.phase is Phase.SESSION_END and event.extra.get("sessionPhase"):
        payload["sessionPhase"] = event.extra["sessionPhase"]
    return payload


def _is_text(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text"


def read_answer(body: str, phase: Phase) -> HookResult:
    """A hook's JSON answer as a `HookResult`; `BadAnswer` when it breaks the contract."""
    if not body.strip():
        return HookResult()
    try:
        answer = json.loads(body)
    except ValueError as exc:
        raise BadAnswer(f"the answer is not JSON: {_cut(body.strip(), 200)!r}") from exc
    if not isinstance(answer, dict):
        raise BadAnswer(f"the answer must be a JSON object, not {type(answer).__name__}")
    decision = answer.get("decision", "allow")
    if decision not in ("allow", "deny", "block"):
        raise BadAnswer(f"decision must be allow or deny, not {decision!r}")
    reason = answer.get("reason", "")
    if not isinstance(reason, str):
        raise BadAnswer("reason must be a string")
    proceed = answer.get("continue", False)
    if not isinstance(proceed, bool):
        raise BadAnswer("continue must be true or false")
    context = answer.get("additionalContext", [])
    if isinstance(context, str):
        context = [context] if context else []
    if not isinstance(context, list) or not all(isinstance(line, str) for line in context):
        raise BadAnswer("additionalContext must be a string or a list of strings")
    new_input = answer.get("updatedInput")
    if new_input is not None:
        if phase is not Phase.BEFORE_TOOL:
            raise BadAnswer("updatedInput is only for beforeTool hooks")
        if not isinstance(new_input, dict):
            raise BadAnswer("updatedInput must be a JSON object")
    if decision != "allow":
        return HookResult(
            denied=True, reason=reason[:MAX_REASON], lines=tuple(context), proceed=proceed
        )
    return HookResult(lines=tuple(context), tool_input=new_input)


def _failure(hook: HookSpec, phase: Phase, what: str) -> HookResult:
    if hook.on_error == "allow":
        log.warning("hook %s (%s) failed, allowed by onError: %s", hook.name, phase, what)
        return HookResult()
    return HookResult(denied=True, reason=f"hook {hook.name} failed: {what}", proceed=False)


def spec_handler(hook: HookSpec, timeout: float, runner: HookRunner) -> HookHandler:
    """One `HookSpec` as a handler: matcher, runner, timeout backstop, onError, answer."""

    async def handle(event: HookEvent) -> HookResult | None:
        tool_phase = event.phase in (Phase.BEFORE_TOOL, Phase.AFTER_TOOL)
        if tool_phase and hook.matcher and not matches(event.tool_name, hook.matcher):
            return None
        payload = event_payload(hook, event)
        try:
            reply = await asyncio.wait_for(
                runner.run(hook, PHASE_NAMES[event.phase], payload, timeout),
                timeout + RUNNER_GRACE_SECONDS,
            )
        except TimeoutError:
            reply = HookReply("failed", reason=f"timed out after {timeout:g} s")
        except Exception as exc:  # a runner bug is a hook failure, and onError decides
            log.exception("hook %s could not run", hook.name)
            reply = HookReply("failed", reason=f"could not run: {exc}")
        if reply.kind == "denied":
            reason = reply.reason.strip()[:MAX_REASON] or f"denied by {hook.name}"
            return HookResult(denied=True, reason=reason, proceed=False)
        if reply.kind == "failed":
            return _failure(hook, event.phase, reply.reason)
        try:
            return read_answer(reply.body, event.phase)
        except BadAnswer as exc:
            return _failure(hook, event.phase, str(exc))

    handle.__qualname__ = f"hook {hook.name}"
    return handle


def hooks_from_spec(spec: AgentHooks, runner: HookRunner, base: Hooks | None = None) -> Hooks:
    """The Agent's hooks, phase by phase in listed order, ahead of `base`'s (e.g. recall)."""
    hooks = Hooks()
    for name, phase in SPEC_PHASES.items():
        for hook in spec.for_phase(name):
            timeout = float(hook.timeout_seconds or spec.timeout_seconds)
            hooks = hooks.with_handler(phase, spec_handler(hook, timeout, runner))
    if base is not None:
        for phase, handlers in base.handlers.items():
            for handler in handlers:
                hooks = hooks.with_handler(phase, handler)
    return hooks
