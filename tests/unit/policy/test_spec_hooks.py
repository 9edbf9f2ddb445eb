"""Agent.spec.hooks in the harness: the answer contract, matchers, timeouts and onError, with
real `/bin/sh` commands run by the harness's own runner."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from corral_api.hook_spec import AgentHooks
from corral_harness.hooks import (
    BadAnswer,
    HookEvent,
    Phase,
    hooks_from_spec,
    read_answer,
)
from corral_harness.hooks.runners import LocalCommandRunner

pytestmark = pytest.mark.timeout(30)


def test_an_empty_answer_allows_and_a_json_answer_is_read() -> None:
    assert not read_answer("", Phase.BEFORE_TOOL).denied
    denied = read_answer(
        '{"decision": "block", "reason": "no", "continue": true}', Phase.BEFORE_TOOL
    )
    assert denied.denied and denied.reason == "no" and denied.proceed is True
    rewritten = read_answer(
        '{"updatedInput": {"command": "ls"}, "additionalContext": "one line"}', Phase.BEFORE_TOOL
    )
    assert rewritten.tool_input == {"command": "ls"} and rewritten.lines == ("one line",)


@pytest.mark.parametrize(
    ("answer", "phase", "message"),
    [
        ("lint ok", Phase.AFTER_TOOL, "not JSON"),
        ("[1]", Phase.AFTER_TOOL, "JSON object"),
        ('{"decision": "maybe"}', Phase.AFTER_TOOL, "allow or deny"),
        ('{"updatedInput": {"a": 1}}', Phase.AFTER_TOOL, "only for beforeTool"),
        ('{"additionalContext": 3}', Phase.AFTER_TOOL, "string or a list"),
        ('{"continue": "yes"}', Phase.BEFORE_TOOL, "true or false"),
    ],
)
def test_an_answer_that_breaks_the_contract_is_refused_with_a_reason(
    answer: str, phase: Phase, message: str
) -> None:
    with pytest.raises(BadAnswer, match=message):
        read_answer(answer, phase)


def _hooks(tmp_path: Path, phase: str, *hooks: dict[str, object]) -> AgentHooks:
    return AgentHooks.model_validate({"timeoutSeconds": 5, phase: list(hooks)})


async def test_a_matcher_picks_the_tools_a_hook_sees(tmp_path: Path) -> None:
    seen = tmp_path / "seen.jsonl"
    spec = _hooks(
        tmp_path,
        "beforeTool",
        {"name": "log-bash", "matcher": ["bash"], "command": f"cat >> {seen}; echo >> {seen}"},
    )
    hooks = hooks_from_spec(spec, LocalCommandRunner(tmp_path / "scratch"))
    for tool in ("read", "bash"):
        event = HookEvent(Phase.BEFORE_TOOL, "c1", "s1", tool_name=tool, tool_input={"x": tool})
        assert not (await hooks.run(event)).denied
    (line,) = [x for x in seen.read_text().splitlines() if x]
    payload = json.loads(line)
    assert payload == {
        "hook": "log-bash",
        "phase": "beforeTool",
        "conversation": "c1",
        "submissionId": "s1",
        "toolName": "bash",
        "toolInput": {"x": "bash"},
    }


async def test_exit_2_denies_with_stderr_and_other_failures_follow_on_error(
    tmp_path: Path,
) -> None:
    runner = LocalCommandRunner(tmp_path / "scratch")
    event = HookEvent(Phase.BEFORE_TOOL, "c1", "s1", tool_name="bash", tool_input={})
    refusing = hooks_from_spec(
        _hooks(tmp_path, "beforeTool", {"name": "no", "command": "echo 'not today' >&2; exit 2"}),
        runner,
    )
    outcome = await refusing.run(event)
    assert outcome.denied and outcome.reason == "not today" and outcome.proceed is False
    assert outcome.denied_by == "hook no"

    for on_error, denied in (("deny", True), ("allow", False)):
        crashing = hooks_from_spec(
            _hooks(
                tmp_path,
                "beforeTool",
                {"name": "crash", "command": "echo boom >&2; exit 7", "onError": on_error},
            ),
            runner,
        )
        outcome = await crashing.run(event)
        assert outcome.denied is denied
        if denied:
            assert outcome.reason == "hook crash failed: exit code 7: boom"


async def test_a_hook_past_its_timeout_is_killed_and_on_error_decides(tmp_path: Path) -> None:
    marker = tmp_path / "still-running"
    spec = _hooks(
        tmp_path,
        "beforeTool",
        {"name": "slow", "command": f"sleep 3; touch {marker}", "timeoutSeconds": 1},
    )
    outcome = await hooks_from_spec(spec, LocalCommandRunner(tmp_path / "s")).run(
        HookEvent(Phase.BEFORE_TOOL, "c1", "s1", tool_name="bash")
    )
    assert outcome.denied and outcome.reason == "hook slow failed: timed out after 1 s"
    await asyncio.sleep(2.5)
    assert not marker.exists()  # the whole process group went


async def test_a_command_hook_gets_a_clean_environment_and_its_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_WIRE_TOKEN_FILE", "/secret/path")
    out = tmp_path / "env.txt"
    spec = _hooks(tmp_path, "afterTurn", {"name": "env", "command": f"env > {out}; pwd >> {out}"})
    await hooks_from_spec(spec, LocalCommandRunner(tmp_path / "scratch")).run(
        HookEvent(Phase.AFTER_TURN, "c1", "s1", final_text="done")
    )
    text = out.read_text()
    assert "CORRAL_WIRE_TOKEN_FILE" not in text
    assert "CORRAL_HOOK_PHASE=afterTurn" in text
    assert str(tmp_path / "scratch") in text.splitlines()[-1]


def test_an_http_hook_url_must_be_http_or_https() -> None:
    with pytest.raises(ValidationError, match="should match pattern"):
        AgentHooks.model_validate({"beforeTool": [{"name": "a", "http": {"url": "ftp://h/x"}}]})
