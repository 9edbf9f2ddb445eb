"""Conversations: the per-conversation queue, the abort sweep, settlements and the event stream.

A conversation runs its submissions one at a time in admission order; a submission runs when it
is the first unsettled one. An abort sweeps the active submission and everything queued at that
moment, settling them in admission order. The active one settles `ended` when the sweep says
`{cause: "pick", submissionId: <its id>}`, else `aborted`; queued ones always settle `aborted`.
Everything is written to the conversation log as it happens and replayed on boot. Another
harness's log can be restored into a new conversation (the operator does so when the sandbox pod
was lost): checked record by record (`RecordCheck`), written, replayed and recovered as at boot,
but what was in flight settles `sandbox_lost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from corral_api.kinds import AgentSpec, SettlementStatus
from corral_api.turnshape import ForcedPlan

from . import metrics
from .engine.messages import for_provider, tool_result_block, tool_results_message
from .engine.seam import DID_NOT_RUN
from .store import LOG_NAME, ConversationLog, conversation_dir, conversation_dirs

log = logging.getLogger("corral.harness")

SweepStatus = Literal["ended", "aborted"]
BACKGROUND_SYNC_SECONDS = 0.02
POLL_BATCH_SECONDS = 0.02

# How a submission in flight settles when its conversation is rebuilt: after a restart of this
# harness (its own log), or in another pod's harness after the sandbox was lost (a restore).
HARNESS_RESTARTED = {
    "type": "harness_restarted",
    "message": "the harness restarted while this submission was in flight",
}
SANDBOX_LOST = {
    "type": "sandbox_lost",
    "message": "the sandbox pod was lost while this submission was in flight; its work since "
    "the last delivery is gone",
}


@dataclass
class Submission:
    id: str
    message: str
    model: str
    thinking_level: str
    agent: AgentSpec
    turn: int | None = None
    # The caller's key for this admission: repeating it returns this submission, not a new one.
    idempotency_key: str | None = None
    admitted_offset: int = 0
    # The JSON Schema the final answer must satisfy (the admission's outputSchema), or None.
    output_schema: dict[str, Any] | None = None
    # The run id the caller's traces carry (the admission's runId); None: the submission id.
    run_id: str | None = None
    # The turn's shape (docs/turns.md): a forced plan, no reactive fallback, a person's replies.
    plan: ForcedPlan | None = None
    decide_then_act: bool = False
    replies: list[str] = field(default_factory=list)
    # The running turn's steer (docs/ledger.md, steering); set while the turn runs.
    steer_to: Callable[[str | None, Any], None] | None = None
    started: bool = False
    settled: bool = False
    # Set when a sweep names this submission's fate; the turn watches it.
    sweep: asyncio.Future[SweepStatus] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    swept_queue: list[Submission] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self) -> dict[str, Any]:
        return {
            "k": "sub",
            "id": self.id,
            "message": self.message,
            "model": self.model,
            "thinking": self.thinking_level,
            "agent": self.agent.model_dump(mode="json", by_alias=True, exclude_none=True),
            "turn": self.turn,
            "key": self.idempotency_key,
            "offset": self.admitted_offset,
            **({"outputSchema": self.output_schema} if self.output_schema is not None else {}),
            **({"runId": self.run_id} if self.run_id is not None else {}),
            **({"plan": self.plan.wire()} if self.plan is not None else {}),
            **({"decideThenAct": True} if self.decide_then_act else {}),
            **({"replies": self.replies} if self.replies else {}),
        }


Runner = Callable[["Conversation", Submission], Awaitable[None]]


class Conversation:
    def __init__(self, agent: str, conversation: str, log_: ConversationLog, runner: Runner):
        self.agent = agent
        self.id = conversation
        self.log = log_
        self._runner = runner
        self.events: list[dict[str, Any]] = []
        self._event_records: list[int] = []  # the log record of each event (0: replayed)
        self._syncer: asyncio.TimerHandle | None = None
        self._pending_syncs: set[asyncio.Future[None]] = set()
        self.transcript: list[dict[str, Any]] = []
        self.submissions: dict[str, Submission] = {}
        self.by_key: dict[str, Submission] = {}
        self.queue: deque[Submission] = deque()
        self.active: Submission | None = None
        # The thinking level a steer set: later turns that name none keep it (a wait keeps
        # its level).
        self.steered_level: str | None = None
        self._grew: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._worker: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------- the stream

    def emit(self, type_: str, submission_id: str, **fields: Any) -> dict[str, Any]:
        event = {
            "offset": len(self.events),
            "type": type_,
            "submissionId": submission_id,
            "ts": round(time.time(), 6),
            **fields,
        }
        self.events.append(event)
        self._event_records.append(self.log.append({"k": "ev", "e": event}))
        self._sync_soon()
        if not self._grew.done():
            self._grew.set_result(None)
        self._grew = asyncio.get_running_loop().create_future()
        return event

    def _sync_soon(self) -> None:
        """Schedule a background group commit shortly, covering every record written by then.

        Readers of the wire force a sync themselves; this one bounds how long a record can sit
        unsynced when nobody is reading, and batches a step's records into one fdatasync.
        """
        if self.log.durable and self._syncer is None:
            self._syncer = asyncio.get_running_loop().call_later(
                BACKGROUND_SYNC_SECONDS, self._sync_now
            )

    def _sync_now(self) -> None:
        self._syncer = None
        task = asyncio.ensure_future(self.log.sync_until(self.log.written))
        self._pending_syncs.add(task)
        task.add_done_callback(self._pending_syncs.discard)

    async def durable(self) -> None:
        """Return once everything recorded so far is on disk."""
        await self.log.sync_until(self.log.written)

    async def events_after(self, offset: int, wait: float) -> list[dict[str, Any]]:
        """Events from `offset` on, only those on disk; with `wait`, long-poll for one."""
        if len(self.events) <= offset and wait > 0:
            deadline = time.monotonic() + wait
            while len(self.events) <= offset:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._grew), left)
        if wait > 0 and len(self.events) > offset:
            # A follower's answer waits until its first event is POLL_BATCH_SECONDS old (woken
            # by a fresh event, or asking again right after an answer while the next step's
            # events come in): what comes meanwhile joins it, so a follower makes one request
            # per batch window rather than one per event, each a request, a sync and a wake-up
            # for the harness beside the turn's own work.
            age = time.time() - float(self.events[offset]["ts"])
            if age < POLL_BATCH_SECONDS:
                await asyncio.sleep(POLL_BATCH_SECONDS - max(age, 0.0))
        end = len(self.events)
        if end > offset:
            await self.log.sync_until(self._event_records[end - 1])
            # Events that reached the disk with the same sync go out in the same answer.
            while end < len(self.events) and self._event_records[end] <= self.log.synced:
                end += 1
        return self.events[offset:end]

    # --------------------------------------------------------------------------- the transcript

    def add_message(self, message: dict[str, Any]) -> None:
        self.transcript.append(message)
        self.log.append({"k": "tx", "op": "append", "m": message})

    def add_tool_result(self, block: dict[str, Any]) -> None:
        _join_result(self.transcript, block)
        self.log.append({"k": "tx", "op": "result", "b": block})

    # --------------------------------------------------------------------------- the queue

    def admit(self, sub: Submission) -> int:
        """Queue a submission; returns the offset its events start after."""
        offset = len(self.events)
        sub.admitted_offset = offset
        self.submissions[sub.id] = sub
        if sub.idempotency_key:
            self.by_key[sub.idempotency_key] = sub
        self.log.append(sub.record())
        self.queue.append(sub)
        self._ensure_worker()
        return offset

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self.queue:
            sub = self.queue.popleft()
            self.active = sub
            try:
                sub.started = True
                self.emit("submission_started", sub.id)
                await self._runner(self, sub)
            except Exception as exc:  # a bug must not wedge the conversation
                log.exception("submission %s crashed", sub.id)
                if not sub.settled:
                    self.settle(sub, "failed", error={"type": "harness_error", "message": str(exc)})
            finally:
                if not sub.settled:
                    self.settle(sub, "failed", error=_STOPPED)  # the harness is stopping
                for queued in sub.swept_queue:
                    self.settle(queued, "aborted", error=_aborted("swept by an abort"))
                self.active = None

    def settle(
        self,
        sub: Submission,
        status: SettlementStatus,
        *,
        error: dict[str, str] | None = None,
        usage: dict[str, Any] | None = None,
        text: str = "",
        receipt: dict[str, Any] | None = None,
        output: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        if sub.settled:
            return
        sub.settled = True
        # One line per turn, naming its run even when an abort from another request settles it.
        log.info(
            "submission %s settled %s%s",
            sub.id,
            status,
            f" ({error.get('type')})" if error else "",
            extra={"runId": sub.run_id or sub.id, "status": status},
        )
        fields: dict[str, Any] = {"status": status, "text": text}
        if error is not None:
            fields["error"] = error
        if usage is not None:
            fields["usage"] = usage
        if receipt is not None:
            fields["receipt"] = receipt
        if output is not None:
            fields["output"] = output  # the answer, validated against the outputSchema
        if extra:
            fields.update(extra)  # the turn's question and plan (docs/turns.md)
        self.emit("settled", sub.id, **fields)
        metrics.SUBMISSIONS.labels(status).inc()
        sub.done.set()

    def steer(
        self, message: str | None, thinking: str | None, submission_id: str | None
    ) -> Submission | None:
        """Hand a steer to the running turn; None when no turn runs (or another one does)."""
        active = self.active
        if active is None or active.settled or active.steer_to is None:
            return None
        if submission_id is not None and submission_id != active.id:
            return None
        if thinking is not None:
            self.steered_level = thinking
        active.steer_to(message, thinking)
        return active

    async def abort(self, cause: str | None, submission_id: str | None) -> bool:
        """The sweep. Returns once every swept submission has settled."""
        active = self.active if self.active is not None and not self.active.settled else None
        if active is None and not self.queue:
            return False
        swept = list(self.queue)
        self.queue.clear()
        if active is None:
            for sub in swept:
                self.settle(sub, "aborted", error=_aborted("swept by an abort"))
            return True
        status: SweepStatus = (
            "ended" if cause == "pick" and submission_id == active.id else "aborted"
        )
        active.swept_queue.extend(swept)
        if not active.sweep.done():
            active.sweep.set_result(status)
        await active.done.wait()
        # The worker settles the swept queue right after the active one; wait for the last.
        for sub in swept:
            await sub.done.wait()
        return True

    # ------------------------------------------------------------------------------- rebuild

    def replay(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            kind = record.get("k")
            if kind == "sub":
                agent = AgentSpec.model_validate(record["agent"])
                sub = Submission(
                    record["id"],
                    record["message"],
                    record["model"],
                    record["thinking"],
                    agent,
                    record.get("turn"),
                    record.get("key"),
                    int(record.get("offset") or 0),
                    output_schema=record.get("outputSchema"),
                    run_id=record.get("runId"),
                    plan=ForcedPlan.model_validate(record["plan"]) if "plan" in record else None,
                    decide_then_act=bool(record.get("decideThenAct")),
                    replies=list(record.get("replies") or []),
                )
                self.submissions[sub.id] = sub
                if sub.idempotency_key:
                    self.by_key[sub.idempotency_key] = sub
            elif kind == "ev":
                event = record["e"]
                self.events.append(event)
                self._event_records.append(0)
                sub_ = self.submissions.get(event["submissionId"])
                if sub_ is not None and event["type"] == "submission_started":
                    sub_.started = True
                if event["type"] == "steered":
                    self.steered_level = event.get("thinkingLevel")
                if sub_ is not None and event["type"] == "settled":
                    sub_.settled = True
                    sub_.done.set()
            elif kind == "tx" and record.get("op") == "append":
                self.transcript.append(record["m"])
            elif kind == "tx" and record.get("op") == "result":
                _join_result(self.transcript, record["b"])

    def recover(self, error: dict[str, str] = HARNESS_RESTARTED) -> list[str]:
        """After replay: fail what was in flight with `error`, answer its open calls, resume the
        queue. Returns the ids of the submissions failed."""
        interrupted: list[str] = []
        for sub in self.submissions.values():
            if sub.settled:
                continue
            if sub.started:
                self._answer_open_calls()
                self.settle(sub, "failed", error=dict(error))
                interrupted.append(sub.id)
            else:
                self.queue.append(sub)
        if self.queue:
            self._ensure_worker()
        return interrupted

    def restore(self, records: list[dict[str, Any]]) -> tuple[int, list[str]]:
        """Rebuild this (new, empty) conversation from another harness's log: write the records
        to this log, replay them as a boot does, and recover what the lost sandbox had in flight.
        Returns the events replayed and the submissions settled `sandbox_lost`."""
        for record in records:
            self.log.append(record)
        self.replay(records)
        replayed = len(self.events)
        # These events were written by this process: a reader waits for their sync, not 0's.
        self._event_records = [self.log.written] * replayed
        return replayed, self.recover(SANDBOX_LOST)

    def _answer_open_calls(self) -> None:
        if not self.transcript:
            return
        # Find the last assistant message and give each of its unanswered calls a result.
        for index in range(len(self.transcript) - 1, -1, -1):
            if self.transcript[index].get("role") == "assistant":
                break
        else:
            return
        asked = [
            b["id"]
            for b in self.transcript[index].get("content", [])
            if b.get("type") == "tool_use"
        ]
        answered = {
            b.get("tool_use_id")
            for m in self.transcript[index + 1 :]
            for b in (m.get("content") or [])
            if isinstance(b, dict)
            if b.get("type") == "tool_result"
        }
        for uid in asked:
            if uid not in answered:
                self.add_tool_result(tool_result_block(uid, DID_NOT_RUN, True))

    def provider_messages(self) -> list[dict[str, Any]]:
        return for_provider(self.transcript)

    async def close(self) -> None:
        if self._syncer is not None:
            self._syncer.cancel()
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            with contextlib.suppress(BaseException):
                await self._worker
        self.log.close()


_STOPPED = {
    "type": "harness_stopped",
    "message": "the harness stopped while this submission was in flight",
}


def _aborted(message: str) -> dict[str, str]:
    return {"type": "submission_aborted", "message": message}


class RecordCheck:
    """Whether log records from elsewhere can be replayed here, checked one at a time in order:
    a known kind, the fields replay reads, events' offsets in sequence from 0 (a client that
    saw an offset before must find the same event under it)."""

    def __init__(self) -> None:
        self.events = 0

    def problem(self, record: Any) -> str | None:
        if not isinstance(record, dict):
            return "a record is a JSON object"
        kind = record.get("k")
        if kind == "sub":
            return _submission_problem(record)
        if kind == "ev":
            problem = _event_problem(record.get("e"), self.events)
            if problem is None:
                self.events += 1
            return problem
        if kind == "tx":
            return _transcript_problem(record)
        return f"unknown record kind {kind!r} (sub, ev or tx)"


_SUB_REQUIRED: dict[str, type] = {
    "id": str,
    "message": str,
    "model": str,
    "thinking": str,
    "agent": dict,
}
_SUB_OPTIONAL: dict[str, type] = {
    "turn": int,
    "key": str,
    "offset": int,
    "outputSchema": dict,
    "runId": str,
    "plan": dict,
    "replies": list,
}


def _submission_problem(record: dict[str, Any]) -> str | None:
    for name, kind in _SUB_REQUIRED.items():
        if not isinstance(record.get(name), kind):
            return f"a sub record needs {name!r} ({kind.__name__})"
    for name, kind in _SUB_OPTIONAL.items():
        if record.get(name) is not None and not isinstance(record[name], kind):
            return f"sub {record['id']}: {name!r} must be {kind.__name__}"
    try:
        AgentSpec.model_validate(record["agent"])
        if record.get("plan") is not None:
            ForcedPlan.model_validate(record["plan"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"sub {record['id']}: {where}: {first['msg']}"
    return None


def _event_problem(event: Any, expected_offset: int) -> str | None:
    if not isinstance(event, dict):
        return "an ev record needs 'e' (an event object)"
    for name in ("type", "submissionId"):
        if not isinstance(event.get(name), str):
            return f"an event needs {name!r} (str)"
    offset = event.get("offset")
    if type(offset) is not int or offset != expected_offset:
        return f"event offset {offset!r} where {expected_offset} comes next"
    return None


def _transcript_problem(record: dict[str, Any]) -> str | None:
    op = record.get("op")
    if op == "append":
        message = record.get("m")
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return "a tx append needs 'm' (a message object with a role)"
        content = message.get("content")
        if isinstance(content, list) and not all(isinstance(b, dict) for b in content):
            return "a message's content blocks are objects"
        return None
    if op == "result":
        if not isinstance(record.get("b"), dict):
            return "a tx result needs 'b' (a content block object)"
        return None
    return f"unknown tx op {op!r} (append or result)"


def _join_result(transcript: list[dict[str, Any]], block: dict[str, Any]) -> None:
    last = transcript[-1] if transcript else None
    if (
        last is not None
        and last.get("role") == "user"
        and isinstance(last.get("content"), list)
        and last.get("tool_results", False)
    ):
        last["content"].append(block)
    else:
        transcript.append(tool_results_message([block]))


class Registry:
    """Every conversation this harness holds, keyed by (agent, conversation)."""

    def __init__(self, state_dir: Path, runner: Runner, *, durable: bool) -> None:
        self.state_dir = state_dir
        self.runner = runner
        self.durable = durable
        self._conversations: dict[tuple[str, str], Conversation] = {}

    def get(self, agent: str, conversation: str) -> Conversation | None:
        return self._conversations.get((agent, conversation))

    def create(self, agent: str, conversation: str) -> Conversation:
        key = (agent, conversation)
        conv = self._conversations.get(key)
        if conv is None:
            directory = conversation_dir(self.state_dir, agent, conversation)
            conv = Conversation(
                agent, conversation, ConversationLog(directory, durable=self.durable), self.runner
            )
            self._conversations[key] = conv
        return conv

    def load(self) -> int:
        """Rebuild every stored conversation; returns how many."""
        count = 0
        for agent, conversation, directory in conversation_dirs(self.state_dir):
            log_ = ConversationLog(directory, durable=self.durable)
            conv = Conversation(agent, conversation, log_, self.runner)
            conv.replay(list(log_.records()))
            self._conversations[(agent, conversation)] = conv
            conv.recover()
            count += 1
        return count

    def restore(
        self, agent: str, conversation: str, records: list[dict[str, Any]]
    ) -> tuple[Conversation, int, list[str]] | None:
        """Rebuild a conversation from another harness's log (records that passed RecordCheck).
        None when this harness holds one of that name, in memory or on disk: a restore comes
        once, before anything is admitted. Else the conversation, the events replayed and the
        submissions settled `sandbox_lost`."""
        key = (agent, conversation)
        directory = conversation_dir(self.state_dir, agent, conversation)
        if key in self._conversations or (directory / LOG_NAME).exists():
            return None
        conv = self.create(agent, conversation)
        try:
            events, interrupted = conv.restore(records)
        except Exception:
            # Half a conversation would refuse every later restore: leave none behind.
            del self._conversations[key]
            conv.log.close()
            conv.log.path.unlink(missing_ok=True)
            raise
        return conv, events, interrupted

    def all(self) -> list[Conversation]:
        return list(self._conversations.values())

    async def close(self) -> None:
        for conv in self._conversations.values():
            await conv.close()


def new_submission_id() -> str:
    return f"sub_{uuid.uuid4().hex}"
