"""Hooks as a value, and how the turn policy applies each phase's outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral_harness.hooks import (
    HookEvent,
    HookResult,
    Hooks,
    Phase,
    add_lines,
    deny,
    replace_system,
    rewrite_input,
)
from corral_harness.policy.turn_policy import CorralTurnPolicy
from corral_harness.ports import ToolCall

from ._helpers import WORKING, ctx

TRANSCRIPT = [{"role": "user", "content": "Please fix the failing test."}]


async def test_handlers_run_in_registration_order_and_a_deny_halts() -> None:
    seen: list[str] = []

    def first(event: HookEvent) -> HookResult:
        seen.append("first")
        return add_lines("one")

    async def second(event: HookEvent) -> HookResult:
        seen.append("second")
        return deny("no thanks")

    def third(event: HookEvent) -> None:
        seen.append("third")

    hooks = Hooks().with_handler(Phase.BEFORE_TOOL, first)
    hooks = hooks.with_handler(Phase.BEFORE_TOOL, second).with_handler(Phase.BEFORE_TOOL, third)
    outcome = await hooks.run(HookEvent(Phase.BEFORE_TOOL))
    assert seen == ["first", "second"]
    assert outcome.denied and outcome.reason == "no thanks" and outcome.lines == ("one",)


async def test_hooks_are_a_value_adding_returns_a_new_one() -> None:
    base = Hooks()
    more = base.with_handler("after_turn", lambda e: deny("x"))
    assert base.for_phase(Phase.AFTER_TURN) == ()
    assert len(more.for_phase(Phase.AFTER_TURN)) == 1
    assert not (await base.run(HookEvent(Phase.AFTER_TURN))).denied
    with pytest.raises(ValueError):
        base.with_handler("not_a_phase", lambda e: None)


async def test_rewrites_and_system_replacements_flow_to_the_next_handler() -> None:
    seen: list[object] = []

    def rewrite(event: HookEvent) -> HookResult:
        return rewrite_input({**event.tool_input, "path": "safe.txt"})

    def observe(event: HookEvent) -> HookResult:
        seen.append(event.tool_input["path"])
        return replace_system("short system")

    def observe_system(event: HookEvent) -> None:
        seen.append(event.system)

    hooks = Hooks()
    for h in (rewrite, observe, observe_system):
        hooks = hooks.with_handler(Phase.BEFORE_TOOL, h)
    outcome = await hooks.run(HookEvent(Phase.BEFORE_TOOL, tool_input={"path": "x"}))
    assert seen == ["safe.txt", "short system"]
    assert outcome.tool_input == {"path": "safe.txt"} and outcome.system == "short system"


async def test_a_handler_that_raises_denies_with_the_error() -> None:
    def broken(event: HookEvent) -> HookResult:
        raise RuntimeError("guard is down")

    outcome = (
        await Hooks().with_handler(Phase.BEFORE_TOOL, broken).run(HookEvent(Phase.BEFORE_TOOL))
    )
    assert outcome.denied and "guard is down" in outcome.reason


async def test_a_pre_tool_deny_blocks_the_call_and_aborts_the_turn(tmp_path: Path) -> None:
    hooks = Hooks().with_handler(Phase.BEFORE_TOOL, lambda e: deny("frozen"))
    policy = CorralTurnPolicy(granted_root=tmp_path, hooks=hooks)
    c = ctx(tmp_path)
    policy.visible_tools(c, WORKING)
    decision = await policy.decide_tool(c, ToolCall("t1", "read", {"path": "a"}))
    assert decision.outcome == "deny" and decision.abort_turn and "frozen" in decision.reason
    lenient = CorralTurnPolicy(granted_root=tmp_path, hooks=hooks, abort_on_pre_deny=False)
    lenient.visible_tools(c, WORKING)
    decision = await lenient.decide_tool(c, ToolCall("t1", "read", {"path": "a"}))
    assert decision.outcome == "deny" and not decision.abort_turn


async def test_a_rewritten_input_is_returned_and_checked_again(tmp_path: Path) -> None:
    target = {"path": "notes.txt", "content": "hi"}
    hooks = Hooks().with_handler(Phase.BEFORE_TOOL, lambda e: rewrite_input(target))
    policy = CorralTurnPolicy(granted_root=tmp_path, hooks=hooks)
    c = ctx(tmp_path)
    policy.visible_tools(c, WORKING)
    decision = await policy.decide_tool(c, ToolCall("t1", "write", {"path": "x", "content": ""}))
    assert decision.outcome == "allow" and decision.input == target
    escaping = Hooks().with_handler(
        Phase.BEFORE_TOOL, lambda e: rewrite_input({"path": "../../etc/passwd"})
    )
    policy = CorralTurnPolicy(granted_root=tmp_path, hooks=escaping)
    policy.visible_tools(c, WORKING)
    decision = await policy.decide_tool(c, ToolCall("t1", "write", {"path": "x"}))
    assert decision.outcome == "deny" and decision.input is None


async def test_call_only_lines_and_system_replacement_never_reach_the_transcript(
    tmp_path: Path,
) -> None:
    hooks = Hooks().with_handler(Phase.BEFORE_GENERATION, lambda e: add_lines("hint: use pytest"))
    hooks = hooks.with_handler(
        Phase.BEFORE_GENERATION, lambda e: replace_system("REPLACED " + e.system[:20])
    )
    policy = CorralTurnPolicy(granted_root=tmp_path, hooks=hooks)
    transcript = [dict(m) for m in TRANSCRIPT]
    plan = await policy.prepare_request(ctx(tmp_path), transcript)
    assert plan.call_only_lines == ["hint: use pytest"]
    assert plan.system.startswith("REPLACED <identity>")
    assert "hint: use pytest" not in repr(plan.messages)
    assert transcript == TRANSCRIPT


async def test_a_before_generation_deny_stops_before_the_provider(tmp_path: Path) -> None:
    hooks = Hooks().with_handler(Phase.BEFORE_GENERATION, lambda e: deny("quota"))
    plan = await CorralTurnPolicy(granted_root=tmp_path, hooks=hooks).prepare_request(
        ctx(tmp_path), list(TRANSCRIPT)
    )
    assert plan.stop_reason is not None and "quota" in plan.stop_reason and plan.messages == []


async def test_before_turn_runs_once_per_submission(tmp_path: Path) -> None:
    calls: list[str] = []
    hooks = Hooks().with_handler(Phase.BEFORE_TURN, lambda e: calls.append(e.submission_id))
    policy = CorralTurnPolicy(granted_root=tmp_path, hooks=hooks)
    for sub in ("s1", "s1", "s2"):
        await policy.prepare_request(ctx(tmp_path, submission=sub), list(TRANSCRIPT))
    assert calls == ["s1", "s2"]
    denying = CorralTurnPolicy(
        granted_root=tmp_path, hooks=Hooks().with_handler(Phase.BEFORE_TURN, lambda e: deny("no"))
    )
    plan = await denying.prepare_request(ctx(tmp_path), list(TRANSCRIPT))
    assert plan.stop_reason == "before-turn hook denied: no"


async def test_after_tool_and_session_hooks_run(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    hooks = Hooks()
    for phase in (Phase.SESSION_START, Phase.AFTER_TOOL, Phase.AFTER_GENERATION, Phase.SESSION_END):
        hooks = hooks.with_handler(phase, lambda e: seen.append((e.phase.value, e.tool_result)))
    policy = CorralTurnPolicy(granted_root=tmp_path, hooks=hooks)
    c = ctx(tmp_path)
    await policy.session_start(c)
    await policy.after_tool(c, ToolCall("t", "read", {"path": "a"}), "contents", False)
    await policy.after_generation(c, {"role": "assistant", "content": "hi"})
    await policy.session_end(c)
    assert seen == [
        ("session_start", ""),
        ("after_tool", "contents"),
        ("after_generation", ""),
        ("session_end", ""),
    ]


async def test_a_denied_completion_goes_back_twice_then_the_turn_stops(tmp_path: Path) -> None:
    hooks = Hooks().with_handler(Phase.AFTER_TURN, lambda e: deny("tests still fail"))
    policy = CorralTurnPolicy(granted_root=tmp_path, hooks=hooks)
    c = ctx(tmp_path)
    verdicts = [await policy.after_turn(c, "done") for _ in range(3)]
    assert [(v.accept, v.stop) for v in verdicts] == [(False, False), (False, False), (False, True)]
    assert all("tests still fail" in v.reason for v in verdicts)
    # A new submission starts with a fresh count.
    assert not (await policy.after_turn(ctx(tmp_path, submission="s2"), "done")).stop
    aborting = CorralTurnPolicy(
        granted_root=tmp_path, hooks=hooks, send_back_denied_completions=False
    )
    assert (await aborting.after_turn(c, "done")).stop


async def test_structured_output_must_be_valid_json_for_its_schema(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"enum": ["ok", "failed"]}, "files": {"type": "array"}},
        "additionalProperties": False,
    }
    policy = CorralTurnPolicy(granted_root=tmp_path, output_schema=schema)
    c = ctx(tmp_path)
    not_json = await policy.after_turn(c, "All done!")
    assert not not_json.accept and "not valid JSON" in not_json.reason
    wrong = await policy.after_turn(c, '{"status": "great", "extra": 1}')
    assert not wrong.accept and "'great' is not one of" in wrong.reason
    ok = await policy.after_turn(ctx(tmp_path, submission="s2"), '{"status": "ok", "files": []}')
    assert ok.accept
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        CorralTurnPolicy(granted_root=tmp_path, output_schema={"oneOf": []})
