"""Agent.spec.hooks through the wire: the real `corral-harness` process runs real command hooks
(scripts this test writes) and the scripted model records what it was sent."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ._rig import AGENT, Harness, Model

pytestmark = pytest.mark.timeout(90)


def agent_with(hooks: dict[str, Any]) -> dict[str, Any]:
    return {**AGENT, "hooks": hooks}


def script(path: Path, body: str) -> str:
    """A hook command: an executable shell script written by the test."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def system_text(request: dict[str, Any]) -> str:
    system = request.get("system", "")
    if isinstance(system, list):
        return "\n".join(block.get("text", "") for block in system)
    return str(system)


def tool_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for message in request["messages"]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


def user_texts(request: dict[str, Any]) -> list[str]:
    texts = []
    for message in request["messages"]:
        if message["role"] != "user":
            continue
        content = message["content"]
        if isinstance(content, str):
            texts.append(content)
            continue
        texts.extend(b.get("text", "") for b in content if b.get("type") == "text")
    return texts


def run_turn(
    harness: Harness, model: Model, conv: str, replies: list[Any], hooks: dict[str, Any]
) -> dict[str, Any]:
    model.script(conv, replies)
    admitted = harness.admit(conv, spec=agent_with(hooks))
    return harness.wait_settled(conv, admitted["submissionId"], timeout=60)


# ------------------------------------------------------------------------ after every write


def test_a_linter_after_every_write_adds_a_line_the_model_sees_next_call_only(
    harness: Harness, model: Model, conv: str, tmp_path: Path
) -> None:
    lint = script(
        tmp_path / "lint.sh",
        # The event names the file; the finding goes back as call-only context.
        'path=$(python3 -c \'import json,sys; print(json.load(sys.stdin)["toolInput"]["path"])\')\n'
        'printf \'{"additionalContext": "lint: %s has trailing whitespace"}\' "$path"\n',
    )
    hooks = {"afterTool": [{"name": "lint", "matcher": ["write", "edit"], "command": lint}]}
    settled = run_turn(
        harness,
        model,
        conv,
        [
            {"tool_use": {"name": "bash", "input": {"command": "echo hi"}}},
            {
                "tool_use": {
                    "name": "write",
                    "input": {"path": f"{conv}.py", "content": "x = 1  \n"},
                }
            },
            "written",
        ],
        hooks,
    )
    assert settled["status"] == "completed", settled
    _, after_bash, after_write = model.requests(conv)
    line = f"lint: {conv}.py has trailing whitespace"
    assert line not in system_text(after_bash)  # the matcher skipped bash
    assert line in system_text(after_write)
    # Call-only: not in any message, so not in the transcript of later calls either.
    assert line not in json.dumps(after_write["messages"])
    assert line not in json.dumps(harness.history(conv))


# ------------------------------------------------------------------------ a veto on rm -rf

NO_RM_RF = (
    'if grep -q "rm -rf"; then echo "rm -rf is not allowed in this repository" >&2; exit 2; fi\n'
)


def test_exit_2_on_rm_rf_vetoes_the_call_and_aborts_the_turn(
    harness: Harness, model: Model, conv: str, tmp_path: Path
) -> None:
    victim = harness.root / f"{conv}-keep"
    victim.mkdir()
    (victim / "file").write_text("precious")
    guard = script(tmp_path / "guard.sh", NO_RM_RF)
    hooks = {"beforeTool": [{"name": "no-rm-rf", "matcher": ["bash"], "command": guard}]}
    settled = run_turn(
        harness,
        model,
        conv,
        [{"tool_use": {"name": "bash", "input": {"command": f"rm -rf {victim.name}"}}}, "gone"],
        hooks,
    )
    assert settled["status"] == "aborted", settled
    assert (victim / "file").read_text() == "precious"
    assert len(model.requests(conv)) == 1  # the turn ended: nothing more was asked
    (blocked,) = [e for e in harness.history(conv) if e["type"] == "tool_blocked"]
    assert blocked["reason"] == "hook denied: rm -rf is not allowed in this repository"


def test_a_denial_with_continue_blocks_the_call_and_the_model_reads_the_reason(
    harness: Harness, model: Model, conv: str, tmp_path: Path
) -> None:
    victim = harness.root / f"{conv}-keep"
    victim.write_text("precious")
    guard = script(
        tmp_path / "guard.sh",
        'if grep -q "rm -rf"; then echo \'{"decision": "deny", "reason": "use git rm", '
        '"continue": true}\'; fi\n',
    )
    hooks = {"beforeTool": [{"name": "no-rm-rf", "matcher": ["bash"], "command": guard}]}
    settled = run_turn(
        harness,
        model,
        conv,
        [
            {"tool_use": {"name": "bash", "input": {"command": f"rm -rf {victim.name}"}}},
            {"tool_use": {"name": "bash", "input": {"command": "echo still-allowed"}}},
            "ok",
        ],
        hooks,
    )
    assert settled["status"] == "completed", settled
    assert victim.read_text() == "precious"
    requests = model.requests(conv)
    assert len(requests) == 3
    denied, ran = tool_results(requests[2])
    assert denied["is_error"] and "hook denied: use git rm" in json.dumps(denied["content"])
    assert "still-allowed" in json.dumps(ran["content"])


def test_updated_input_rewrites_the_call_before_it_runs(
    harness: Harness, model: Model, conv: str, tmp_path: Path
) -> None:
    rewrite = script(
        tmp_path / "rewrite.sh",
        'cat >/dev/null; echo \'{"updatedInput": {"command": "echo rewritten-by-hook"}}\'\n',
    )
    hooks = {"beforeTool": [{"name": "rewrite", "matcher": ["bash"], "command": rewrite}]}
    settled = run_turn(
        harness,
        model,
        conv,
        [{"tool_use": {"name": "bash", "input": {"command": "echo original"}}}, "done"],
        hooks,
    )
    assert settled["status"] == "completed", settled
    (result,) = tool_results(model.requests(conv)[1])
    assert "rewritten-by-hook" in json.dumps(result["content"])


# ------------------------------------------------------------------------ a completion gate


def test_a_completion_gate_sends_the_first_answer_back_once(
    harness: Harness, model: Model, conv: str, tmp_path: Path
) -> None:
    seen = tmp_path / "answers"
    gate = script(
        tmp_path / "gate.sh",
        f"cat >> {seen}; echo >> {seen}\n"
        f'if [ "$(grep -c . {seen})" -lt 2 ]; then\n'
        '  echo \'{"decision": "deny", "reason": "run the tests first", "continue": true}\'\n'
        "fi\n",
    )
    hooks = {"afterTurn": [{"name": "tests-first", "command": gate}]}
    settled = run_turn(harness, model, conv, ["done, trust me", "tests pass, done"], hooks)
    assert settled["status"] == "completed", settled
    requests = model.requests(conv)
    assert len(requests) == 2
    assert any("run the tests first" in t for t in user_texts(requests[1]))
    first, second = (json.loads(x) for x in seen.read_text().splitlines() if x)
    assert first["finalText"] == "done, trust me" and second["finalText"] == "tests pass, done"


def test_a_gate_that_never_passes_sends_back_twice_then_the_turn_fails(
    harness: Harness, model: Model, conv: str, tmp_path: Path
) -> None:
    gate = script(
        tmp_path / "gate.sh",
        'cat >/dev/null; echo \'{"decision": "deny", "reason": "not yet", "continue": true}\'\n',
    )
    hooks = {"afterTurn": [{"name": "never", "command": gate}]}
    settled = run_turn(harness, model, conv, ["one", "two", "three", "four"], hooks)
    assert settled["status"] == "failed"
    assert settled["error"]["type"] == "turn_rejected"
    assert len(model.requests(conv)) == 3  # the answer and two send-backs


def test_an_after_turn_denial_without_continue_ends_the_turn_at_once(
    harness: Harness, model: Model, conv: str, tmp_path: Path
) -> None:
    gate = script(tmp_path / "gate.sh", "echo 'the answer leaks a secret' >&2; exit 2\n")
    hooks = {"afterTurn": [{"name": "leak-check", "command": gate}]}
    settled = run_turn(harness, model, conv, ["here is the key", "unused"], hooks)
    assert settled["status"] == "failed"
    assert settled["error"]["type"] == "turn_rejected"
    assert "the answer leaks a secret" in settled["error"]["message"]
    assert len(model.requests(conv)) == 1


def test_an_after_generation_gate_with_continue_asks_the_model_again(
    harness: Harness, model: Model, conv: str, tmp_path: Path
) -> None:
    gate = script(
        tmp_path / "gate.sh",
        'if grep -q "TODO"; then echo \'{"decision": "deny", "reason": "no TODOs in answers", '
        '"continue": true}\'; fi\n',
    )
    hooks = {"afterGeneration": [{"name": "no-todo", "command": gate}]}
    settled = run_turn(harness, model, conv, ["done TODO tests", "done, tested"], hooks)
    assert settled["status"] == "completed", settled
    requests = model.requests(conv)
    assert len(requests) == 2
    assert "no TODOs in answers" in json.dumps(requests[1])


# ------------------------------------------------------------------------ failures


@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_a_hook_that_times_out_fails_open_or_closed_as_configured(
    harness: Harness, model: Model, conv: str, tmp_path: Path, on_error: str
) -> None:
    marker = harness.root / f"{conv}-ran"
    hooks = {
        "beforeTool": [
            {"name": "slow", "command": "sleep 10", "timeoutSeconds": 1, "onError": on_error}
        ]
    }
    started = time.monotonic()
    settled = run_turn(
        harness,
        model,
        conv,
        [{"tool_use": {"name": "bash", "input": {"command": f"touch {marker.name}"}}}, "done"],
        hooks,
    )
    assert time.monotonic() - started < 8  # the hook was not waited for
    if on_error == "allow":
        assert settled["status"] == "completed", settled
        assert marker.exists()
    else:
        assert settled["status"] == "aborted", settled
        assert not marker.exists()
        (blocked,) = [e for e in harness.history(conv) if e["type"] == "tool_blocked"]
        assert blocked["reason"] == "hook denied: hook slow failed: timed out after 1 s"


# ------------------------------------------------------------------------ session start/end


def test_session_start_runs_before_the_first_turn_only_and_session_end_on_the_end_signal(
    harness: Harness, model: Model, conv: str, tmp_path: Path
) -> None:
    log = tmp_path / "session.log"
    record = script(
        tmp_path / "record.sh",
        f'python3 -c \'import json,sys; e=json.load(sys.stdin); print(e["phase"], '
        f'e.get("sessionPhase", "-"))\' >> {log}\n'
        'echo \'{"additionalContext": "session rules: be careful"}\'\n',
    )
    spec = agent_with(
        {
            "sessionStart": [{"name": "open", "command": record}],
            "sessionEnd": [{"name": "close", "command": record}],
        }
    )
    model.script(conv, ["first", "second"])
    for _ in range(2):
        settled = harness.wait_settled(conv, harness.admit(conv, spec=spec)["submissionId"])
        assert settled["status"] == "completed", settled
    first, second = model.requests(conv)
    assert "session rules: be careful" in system_text(first)
    assert "session rules: be careful" not in system_text(second)
    assert log.read_text() == "sessionStart -\n"

    ended = harness.post(f"/agents/agent/{conv}/end", {"agent": spec, "phase": "Succeeded"})
    assert ended.status_code == 200 and ended.json() == {"ended": True, "denied": False}
    assert log.read_text() == "sessionStart -\nsessionEnd Succeeded\n"
    again = harness.post(f"/agents/agent/{conv}/end", {"phase": "Succeeded"})
    assert again.json()["ended"] is False  # once per conversation
    unknown = harness.post("/agents/agent/c-unknown-end/end", {})
    assert unknown.status_code == 200 and unknown.json()["ended"] is False
    bad = harness.post(f"/agents/agent/{conv}/end", {"phase": 3})
    assert bad.status_code == 400 and bad.json()["error"] == "bad_request"


def test_hooks_are_read_from_every_submission(
    harness: Harness, model: Model, conv: str, tmp_path: Path
) -> None:
    guard = script(tmp_path / "guard.sh", NO_RM_RF)
    model.script(
        conv,
        [
            {"tool_use": {"name": "bash", "input": {"command": "echo 'rm -rf' first"}}},
            "first done",
            {"tool_use": {"name": "bash", "input": {"command": "echo 'rm -rf' second"}}},
        ],
    )
    plain = harness.admit(conv, spec=AGENT)
    assert harness.wait_settled(conv, plain["submissionId"])["status"] == "completed"
    guarded = agent_with({"beforeTool": [{"name": "g", "matcher": ["bash"], "command": guard}]})
    second = harness.admit(conv, "again", spec=guarded)
    assert harness.wait_settled(conv, second["submissionId"])["status"] == "aborted"


def test_a_bad_hook_spec_is_a_400_at_admission(harness: Harness, conv: str) -> None:
    spec = agent_with({"beforeTool": [{"name": "Bad Name", "command": "true"}]})
    response = harness.post(f"/agents/agent/{conv}", {"message": "go", "agent": spec})
    assert response.status_code == 400
    assert "agent.hooks.beforeTool.0.name" in response.json()["reason"]


def test_a_hook_runs_as_the_harness_with_a_clean_environment(
    harness: Harness, model: Model, conv: str, tmp_path: Path
) -> None:
    out = tmp_path / "env"
    hooks = {"afterTurn": [{"name": "env", "command": f"env > {out}; pwd >> {out}"}]}
    settled = run_turn(harness, model, conv, ["done"], hooks)
    assert settled["status"] == "completed"
    text = out.read_text()
    assert "CORRAL_STATE_DIR" not in text and "ANTHROPIC_BASE_URL" not in text
    assert str(harness.root) not in text.splitlines()[-1]  # not in the workspace
    assert os.path.isabs(text.splitlines()[-1])
