"""Prompt-cache breakpoints (engine/caching.py): the request of a turn's second step marks the
end of the tool list, of the identity, of the instruction files and of the conversation so far,
never more than four, on copies of the transcript's blocks."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from corral_api.kinds import AgentSpec, ToolPolicy
from corral_common.catalog import resolve_model
from corral_harness.engine._loop import request_params
from corral_harness.engine.caching import MAX_BREAKPOINTS, system_blocks, with_breakpoints
from corral_harness.engine.messages import for_provider, tool_result_block, user_text
from corral_harness.engine.seam import EngineJob, EngineTool
from corral_harness.paths import GrantedRoot
from corral_harness.policy.turn_policy import CorralTurnPolicy
from corral_harness.ports import TurnContext
from corral_harness.tools import ToolResult, WorkingTools
from tests._scripted import marked_paths, unmarked

MARK = {"type": "ephemeral"}
AGENT = AgentSpec(
    identity="You are careful.",
    instructions="Never edit a test.",
    model="corral-scripted",
    tools=ToolPolicy(allow=["*"]),
)


async def _never(args: dict[str, Any]) -> ToolResult:
    raise AssertionError("no tool runs here")


def _step_two() -> list[dict[str, Any]]:
    """The transcript when a turn's second request is built: the task, the model's call, and
    the call's result."""
    call = {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "make"}}
    return [
        user_text("fix the build"),
        {"role": "assistant", "content": [{"type": "text", "text": "Building."}, call]},
        {"role": "user", "content": [tool_result_block("t1", "ok", False)]},
    ]


async def _second_request(root: Path, breakpoints: bool = True) -> tuple[dict[str, Any], Any]:
    (root / "AGENTS.md").write_text("ROOT-RULE: keep diffs small\n")
    policy = CorralTurnPolicy(granted_root=root)
    ctx = TurnContext(
        conversation="c",
        submission_id="s",
        agent=AGENT,
        model=AGENT.model,
        thinking_level="low",
        granted_root=root,
        read_only=False,
        context_window=200_000,
        max_output_tokens=1_000,
    )
    transcript = _step_two()
    before = copy.deepcopy(transcript)
    plan = await policy.prepare_request(ctx, transcript)
    tools = {s.name: EngineTool(s, _never) for s in WorkingTools(GrantedRoot(root)).specs()}
    job = EngineJob("c", resolve_model(AGENT.model), "low", "", [*tools.values()], [], None, 1000)
    messages = for_provider(plan.messages)
    body = request_params(
        job,
        tools,
        plan.system,
        messages,
        stable_system=plan.stable_system,
        breakpoints=breakpoints,
    )
    assert transcript == before  # the markers went on copies
    return body, plan


async def test_the_second_step_marks_tools_identity_instructions_and_conversation(
    tmp_path: Path,
) -> None:
    body, plan = await _second_request(tmp_path)
    assert marked_paths(body) == [
        f"tools[{len(body['tools']) - 1}]",
        "system[0]",
        "system[1]",
        "messages[2].content[0]",
    ]
    identity, instructions, rest = body["system"]
    assert identity == {
        "type": "text",
        "text": "<identity>\nYou are careful.\n</identity>",
        "cache_control": MARK,
    }
    assert instructions["cache_control"] == MARK
    assert "ROOT-RULE" in instructions["text"] and "Never edit a test." in instructions["text"]
    assert "cache_control" not in rest and rest["text"].startswith("<project_context>")
    # Joined, the blocks are the prompt the policy assembled; the messages are the transcript's.
    assert "\n\n".join(b["text"] for b in body["system"]) == plan.system
    assert unmarked(body["messages"]) == for_provider(_step_two())


async def test_without_breakpoints_the_request_is_as_before(tmp_path: Path) -> None:
    body, plan = await _second_request(tmp_path, breakpoints=False)
    assert marked_paths(body) == [] and body["system"] == plan.system
    assert "cache_control" not in json.dumps(body)


def test_a_prompt_the_stable_parts_do_not_lead_stays_one_string() -> None:
    # A hook replaced the prompt: the policy's parts are not its start.
    assert system_blocks("a replaced prompt", ("<identity>x</identity>",), 2) == "a replaced prompt"
    # A part must end at a section's end, not inside one.
    assert system_blocks("<a>\n\n<b>", ("<a", ""), 2) == "<a>\n\n<b>"
    assert system_blocks("<a>\n\n<b>", ("<a>",), 0) == "<a>\n\n<b>"


def test_never_more_than_four_markers_and_a_paused_answer_goes_back_unmarked() -> None:
    params = {
        "tools": [{"name": "a"}, {"name": "b"}],
        "system": "\n\n".join(["one", "two", "three", "four"]),
        "messages": for_provider(_step_two()),
    }
    marked = with_breakpoints(params, ("one", "two", "three"))
    assert marked_paths(marked) == ["tools[1]", "system[0]", "system[1]", "messages[2].content[0]"]
    assert len(marked_paths(marked)) == MAX_BREAKPOINTS
    assert marked["system"][2] == {"type": "text", "text": "three\n\nfour"}
    # The model's own answer sent back to go on (pause_turn) goes back as it came.
    answer = {"role": "assistant", "content": [{"type": "text", "text": "Still searching"}]}
    paused = {**params, "messages": [user_text("find it"), answer]}
    assert marked_paths(with_breakpoints(paused, ())) == ["tools[1]"]
