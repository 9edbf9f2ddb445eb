"""The events of a conversation's stream, as `/updates` and `/history` return them.

Every event has `offset` (its index in the conversation's stream), `type`, `submissionId`
and `ts` (seconds since the epoch, for latency figures). The types and their own fields:

- `submission_started`: the submission became the active one of its conversation.
- `turn_started` {runId, requestedLoop, thinkingLevel}: the turn's ledger opened (docs/ledger.md).
- `steered` {thinkingLevel, message?}: a steer was applied before the next model request.
- `message` {role, content, stopReason, usage}: one complete assistant message at message_end;
  `content` is a list of Anthropic content blocks. It is also emitted with the partial content
  when an abort cut the stream (stopReason `aborted`).
- `tool_start` {toolUseId, name, input}: a call of the model answer is about to be checked and
  run. Sent for every call, in order, before its tool or arguments are checked.
- `tool_end` {toolUseId, name, isError, result}: the call's result, summarised to at most 2000
  characters (the model got the whole result).
- `tool_blocked` {toolUseId, name, outcome: deny|ask, reason}: the policy refused the call, or
  sent it to a human.
- `approval_requested` {approvalId, toolUseId, name}: a human decision is pending.
- `step_boundary` {step}: the results of a model answer's calls are in; `step` counts from 1.
- `settled` {status, error?, usage?, text, receipt}: the submission's settlement; `status` is
  completed | ended | failed | aborted; `text` is the run's final assistant text; `usage` is
  {input, output, cacheRead, cacheWrite, cost} summed over its model answers (absent when the
  model never answered); `receipt` is the turn's ledger, `corral_api.wire.TurnReceipt`
  (docs/ledger.md; absent when the submission never started).
"""

from __future__ import annotations

from typing import Any, Final, Literal

EventType = Literal[
    "submission_started",
    "turn_started",
    "steered",
    "message",
    "tool_start",
    "tool_end",
    "tool_blocked",
    "approval_requested",
    "step_boundary",
    "settled",
]

RESULT_SUMMARY_CHARS: Final = 2000


def summarise(result: str, limit: int = RESULT_SUMMARY_CHARS) -> str:
    if len(result) <= limit:
        return result
    marker = f"\n[... {len(result) - limit} more characters]"
    return result[: limit - len(marker)] + marker


def usage_fields(
    input: int, output: int, cache_read: int, cache_write: int, cost: float
) -> dict[str, Any]:
    return {
        "input": input,
        "output": output,
        "cacheRead": cache_read,
        "cacheWrite": cache_write,
        "cost": cost,
    }
