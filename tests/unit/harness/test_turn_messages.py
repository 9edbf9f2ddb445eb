"""The turn's messages have one owner (ADR 0100): every request is derived from the engine's own
list, with what the turn wrote itself (steers, compaction entries) spliced in where it was
written, and the transcript records the same messages in the same order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral_api.kinds import AgentSpec, ToolPolicy
from corral_common.catalog import resolve_model
from corral_harness.approvals.file_port import FileApprovalPort
from corral_harness.conversations import Conversation, Submission
from corral_harness.custodian_client.menu import MenuClient
from corral_harness.default_policy import DefaultPolicy
from corral_harness.engine._loop import EngineSettings
from corral_harness.engine.lean_engine import LeanEngine
from corral_harness.engine.messages import for_provider, user_text
from corral_harness.engine.seam import EngineAdapter, EngineJob
from corral_harness.paths import GrantedRoot
from corral_harness.ports import ModelRequestPlan, ToolCall, TurnContext
from corral_harness.store import ConversationLog
from corral_harness.tools import WorkingTools
from corral_harness.turn import Turn, TurnDeps, _Run
from tests._scripted import ScriptedServer, unmarked

pytestmark = pytest.mark.timeout(30)

MODEL = "corral-scripted"
COMPACTION = user_text("[corral:compaction]{} an earlier part, summarised")


class SteeringPolicy(DefaultPolicy):
    """The default policy, plus a steer sent while the first tool call's result comes in and a
    compaction entry asked for with the first request; it keeps what each request was given
    beside the transcript at that moment."""

    def __init__(self, conv: Conversation) -> None:
        super().__init__()
        self.conv = conv
        self.sub: Submission | None = None
        self.requests = 0
        self.given: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

    async def prepare_request(
        self, ctx: TurnContext, transcript: list[dict[str, Any]]
    ) -> ModelRequestPlan:
        self.given.append((list(transcript), list(self.conv.transcript)))
        plan = await super().prepare_request(ctx, transcript)
        self.requests += 1
        if self.requests == 1:
            plan.compaction = COMPACTION
        return plan

    async def after_tool(
        self, ctx: TurnContext, call: ToolCall, result: str, is_error: bool
    ) -> None:
        if self.sub is not None and self.sub.steer_to is not None:
            self.sub.steer_to("also say which shell ran it", None)
            self.sub = None


def _agent() -> AgentSpec:
    return AgentSpec(identity="You are careful.", model=MODEL, tools=ToolPolicy(allow=["*"]))


def _conversation(tmp_path: Path, name: str) -> Conversation:
    async def never(conv: Conversation, sub: Submission) -> None:
        raise AssertionError("the test runs the turn itself")

    return Conversation("agent", name, ConversationLog(tmp_path / name, durable=False), never)


def _deps(tmp_path: Path, policy: DefaultPolicy, scripted: ScriptedServer) -> TurnDeps:
    root = tmp_path / "root"
    root.mkdir()

    async def engine() -> EngineAdapter:
        return lambda: LeanEngine(EngineSettings(base_url=scripted.url, backoff_seconds=0.01))

    return TurnDeps(
        policy=policy,
        approvals=FileApprovalPort(tmp_path / "approvals"),
        tools=WorkingTools(GrantedRoot(root)),
        menu=MenuClient(None),
        engine=engine,
        granted_root=root,
        read_only=False,
        pick_sweep_seconds=1.0,
    )


def _submission(message: str) -> Submission:
    return Submission("sub-1", message, MODEL, "low", _agent())


async def test_the_request_is_the_engines_list_with_the_turns_own_messages_spliced_in(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    conv = _conversation(tmp_path, "splice")
    sub = _submission("go")
    conv.add_message(user_text("go"))
    deps = _deps(tmp_path, DefaultPolicy(), scripted)
    ctx = TurnContext(
        conversation=conv.id,
        submission_id=sub.id,
        agent=sub.agent,
        model=MODEL,
        thinking_level="low",
        granted_root=deps.granted_root,
        read_only=False,
        context_window=200_000,
        max_output_tokens=500,
    )
    run = _Run(deps, conv, sub, ctx, {}, resolve_model(MODEL))
    job = EngineJob(conv.id, run.info, "low", "", [], list(conv.transcript), None, 500)
    run.begin_job(job)
    engine_list = [*job.context]
    run.steer("a steer", None)

    first = await run.convert_messages(engine_list)
    assert first == [user_text("go"), user_text("a steer")]
    assert conv.transcript == first  # the steer is recorded where it is sent

    # The engine appends what the transcript does not hold: the request carries it, after the
    # steer, which stays where it was written.
    answer = {"role": "assistant", "content": [{"type": "text", "text": "only the engine's"}]}
    engine_list.append(answer)
    assert await run.convert_messages(engine_list) == [
        user_text("go"),
        user_text("a steer"),
        answer,
    ]
    assert engine_list == [user_text("go"), answer]  # transformed, never replaced


async def test_every_request_of_a_turn_is_the_transcript_as_it_stood(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    bash = {"tool_uses": [{"name": "bash", "input": {"command": "echo one"}}]}
    scripted.load({"conversations": {"whole": [bash, "done"]}})
    conv = _conversation(tmp_path, "whole")
    policy = SteeringPolicy(conv)
    sub = _submission("run echo")
    policy.sub = sub
    await Turn(_deps(tmp_path, policy, scripted))(conv, sub)

    assert conv.events[-1]["type"] == "settled" and conv.events[-1]["status"] == "completed"
    transcript = conv.transcript
    roles = [m["role"] for m in transcript]
    assert roles == ["user", "user", "assistant", "user", "user", "assistant"]
    assert transcript[1] == COMPACTION  # written after the first request, before its answer
    assert transcript[4] == user_text("also say which shell ran it")  # the steer, after results
    # Compared without the prompt-cache marker each request puts on its last block.
    sent = [unmarked(r["body"]["messages"]) for r in scripted.requests("whole")]
    answers = [i for i, m in enumerate(transcript) if m["role"] == "assistant"]
    assert len(sent) == len(answers) == 2
    # Request 1 had neither the compaction entry (asked for with it) nor anything after it;
    # request 2 had everything the transcript held before its answer, in the same order.
    assert sent[0] == for_provider(transcript[:1])
    assert sent[1] == for_provider(transcript[: answers[1]])
    assert sent[1][-1]["content"][-1] == {"type": "text", "text": "also say which shell ran it"}
    # What the policy (and its hooks) assembled from was the transcript, message for message.
    assert len(policy.given) == 2
    for derived, recorded in policy.given:
        assert derived == recorded


async def test_a_failed_stream_keeps_its_partial_text_and_usage_in_the_record(
    tmp_path: Path, scripted: ScriptedServer
) -> None:
    """The error event comes after the text: the answer fails, and what it had streamed is in
    the transcript, the message events, the settlement's usage and the ledger."""
    fault = {"error_event": True, "after_blocks": 1, "type": "overloaded_error"}
    usage = {"input_tokens": 100, "output_tokens": 9}
    reply = {"text": "half an answer", "usage": usage, "fault": fault}
    scripted.load({"conversations": {"failing": [reply]}})
    conv = _conversation(tmp_path, "failing")
    await Turn(_deps(tmp_path, DefaultPolicy(), scripted))(conv, _submission("go"))

    partial = {"role": "assistant", "content": [{"type": "text", "text": "half an answer"}]}
    assert conv.transcript[-1] == partial
    [message] = [e for e in conv.events if e["type"] == "message"]
    assert message["stopReason"] == "error" and message["usage"]["input"] == 100
    settled = conv.events[-1]
    assert settled["status"] == "failed" and settled["error"]["type"] == "overloaded_error"
    assert settled["usage"]["input"] == 100
    assert settled["receipt"]["tokensByLayer"]["reactive"] > 100
