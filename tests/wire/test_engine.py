"""The engine through the wire: order of calls, aborts, orphans, retries, timeouts, limits.

Every test runs against two harness processes, one per engine adapter (CORRAL_ENGINE=lean, the
default, and CORRAL_ENGINE=sdk, the official SDK it is held to).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from corral_harness.engine.seam import DID_NOT_RUN

from ._rig import AGENT, Harness, MenuStandIn, Model

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", params=["lean", "sdk"])
def harness(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    model: Model,
    menu: tuple[MenuStandIn, str],
) -> Iterator[Harness]:
    """This module's harness process, once per engine adapter (it shadows the shared one)."""
    engine = str(request.param)
    tmp = tmp_path_factory.mktemp(f"harness-{engine}")
    (tmp / "state").mkdir()
    (tmp / "root").mkdir()
    proc = Harness(
        model.url, menu[1], tmp / "state", tmp / "root", extra_env={"CORRAL_ENGINE": engine}
    )
    proc.start()
    yield proc
    proc.stop()


def _events(harness: Harness, conv: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in harness.history(conv) if e["type"] == kind]


def _assert_no_orphans(requests: list[dict[str, Any]]) -> None:
    """Every tool_use sent to the provider is answered in the very next message."""
    for body in requests:
        messages = body["messages"]
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            asked = {b["id"] for b in message["content"] if b["type"] == "tool_use"}
            if asked:
                answered = {
                    b["tool_use_id"]
                    for b in messages[i + 1]["content"]
                    if b["type"] == "tool_result"
                }
                assert asked <= answered, f"orphan tool_use in {message}"


def test_calls_of_one_answer_run_one_at_a_time_in_written_order(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            {
                "tool_uses": [
                    {"name": "bash", "input": {"command": "sleep 0.3; echo a >> order.txt"}},
                    {"name": "bash", "input": {"command": "echo b >> order.txt"}},
                    {"name": "write", "input": {"path": "w.txt", "content": "c"}},
                    {"name": "bash", "input": {"command": "cat w.txt >> order.txt"}},
                ]
            },
            "done",
        ],
    )
    settled = harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    assert settled["status"] == "completed"
    assert (harness.root / "order.txt").read_text().split() == ["a", "b", "c"]
    kinds = [e["type"] for e in harness.history(conv) if e["type"].startswith("tool_")]
    assert kinds == ["tool_start", "tool_end"] * 4
    (settled,) = _events(harness, conv, "settled")
    assert settled["receipt"]["toolsRun"] == ["bash", "bash", "write", "bash"]
    assert [e["step"] for e in _events(harness, conv, "step_boundary")] == [1]
    second = model.requests(conv)[1]
    results = second["messages"][-1]["content"]
    assert [r["type"] for r in results] == ["tool_result"] * 4
    _assert_no_orphans(model.requests(conv))


def test_abort_mid_stream_keeps_the_partial_assistant_message(
    harness: Harness, model: Model, conv: str
) -> None:
    long_text = "word " * 200
    model.script(conv, [{"text": long_text, "event_delay": 0.05}, "after the abort"])
    admitted = harness.admit(conv)
    model.wait_requests(conv, 1)
    time.sleep(0.6)
    assert harness.abort(conv)
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["status"] == "aborted"
    (message,) = _events(harness, conv, "message")
    assert message["stopReason"] == "aborted"
    partial = message["content"][0]["text"]
    assert partial and long_text.startswith(partial) and len(partial) < len(long_text)
    assert settled["text"] == partial
    # The next submission sends the partial message back as part of the conversation.
    follow = harness.admit(conv, "continue")
    harness.wait_settled(conv, follow["submissionId"], follow["offset"])
    sent = model.requests(conv)[1]["messages"]
    assert sent[1] == {"role": "assistant", "content": [{"type": "text", "text": partial}]}
    assert sent[2]["content"][-1]["text"] == "continue"


def test_abort_during_a_tool_answers_every_call_and_runs_no_later_one(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            {
                "tool_uses": [
                    {"name": "bash", "input": {"command": "sleep 20"}},
                    {"name": "bash", "input": {"command": "touch never.txt"}},
                ]
            },
            "resumed",
        ],
    )
    admitted = harness.admit(conv)
    harness.wait_for(conv, "tool_start")
    time.sleep(0.2)
    started = time.monotonic()
    assert harness.abort(conv)
    assert time.monotonic() - started < 5  # the sleeping command was killed
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["status"] == "aborted"
    assert not (harness.root / "never.txt").exists()
    assert len(_events(harness, conv, "tool_start")) == 1
    follow = harness.admit(conv, "go on")
    assert harness.wait_settled(conv, follow["submissionId"], follow["offset"])["text"] == "resumed"
    requests = model.requests(conv)
    _assert_no_orphans(requests)
    results = requests[1]["messages"][2]["content"]
    assert results[0]["is_error"] is True and "interrupted" in results[0]["content"]
    assert results[1] == {
        "type": "tool_result",
        "tool_use_id": results[1]["tool_use_id"],
        "content": DID_NOT_RUN,
        "is_error": True,
    }


def test_unknown_tools_and_bad_arguments_get_the_engines_error(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            {
                "tool_uses": [
                    {"name": "teleport", "input": {}},
                    {"name": "bash", "input": {"cmd": "echo x"}},
                    {"name": "bash", "input": {"command": "echo ran"}},
                ]
            },
            "ok",
        ],
    )
    harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    # tool_start comes for every call, before its tool or arguments are checked.
    starts = [e["name"] for e in _events(harness, conv, "tool_start")]
    assert starts == ["teleport", "bash", "bash"]
    results = model.requests(conv)[1]["messages"][-1]["content"]
    assert "no tool named 'teleport'" in results[0]["content"] and results[0]["is_error"]
    assert "missing the required field 'command'" in results[1]["content"]
    assert results[2]["content"] == "ran\n" and "is_error" not in results[2]


def test_the_agents_tool_policy_blocks_a_call_it_does_not_allow(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, [{"tool_use": {"name": "bash", "input": {"command": "touch x"}}}, "ok"])
    spec = {**AGENT, "tools": {"allow": ["*"], "deny": ["ba*"]}}
    harness.wait_settled(conv, harness.admit(conv, spec=spec)["submissionId"])
    # Deny beats the wildcard allow: bash is not offered, and the call the model makes anyway
    # is answered with an error and never runs.
    first, second = model.requests(conv)
    assert "bash" not in {t["name"] for t in first["tools"]} and "read" in {
        t["name"] for t in first["tools"]
    }
    (result,) = second["messages"][-1]["content"]
    assert result["is_error"] is True
    assert not (harness.root / "x").exists()
    (settled,) = _events(harness, conv, "settled")
    receipt = settled["receipt"]
    assert receipt["toolsRun"] == []
    assert receipt["steps"] == 1 and receipt["model"] == "corral-scripted"


@pytest.mark.parametrize(
    "faults",
    [
        [{"status": 529, "type": "overloaded_error"}, {"status": 500}],
        [{"status": 429, "type": "rate_limit_error"}],
        [{"error_event": True, "after_blocks": 0}],
        [{"truncate": True, "after_blocks": 0}],
    ],
    ids=["5xx-twice", "429", "error-event-before-content", "truncated-before-content"],
)
def test_faults_before_any_content_are_retried(
    harness: Harness, model: Model, conv: str, faults: list[dict[str, Any]]
) -> None:
    model.script(conv, [{"fault": f, "text": "lost"} for f in faults] + ["recovered"])
    settled = harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    assert settled["status"] == "completed"
    assert settled["text"] == "recovered"
    assert len(model.requests(conv)) == len(faults) + 1


def test_retries_stop_after_two(harness: Harness, model: Model, conv: str) -> None:
    model.script(conv, [{"fault": {"status": 503, "message": "down"}}] * 4)
    settled = harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    assert settled["status"] == "failed"
    assert "503" in settled["error"]["message"]
    assert len(model.requests(conv)) == 3  # one try and two retries


@pytest.mark.parametrize(
    "fault",
    [
        {"error_event": True, "after_blocks": 1, "type": "overloaded_error"},
        {"truncate": True, "after_blocks": 1},
    ],
    ids=["error-event", "truncated"],
)
def test_no_retry_once_content_was_forwarded(
    harness: Harness, model: Model, conv: str, fault: dict[str, Any]
) -> None:
    model.script(conv, [{"text": "half an answer", "fault": fault}, "a retry would get this"])
    settled = harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    assert settled["status"] == "failed"
    assert settled["error"]["type"] in ("overloaded_error", "stream_truncated")
    assert len(model.requests(conv)) == 1


def test_a_silent_stream_fails_without_retry(harness: Harness, model: Model, conv: str) -> None:
    model.script(conv, [{"fault": {"silence": 5}, "text": "late"}, "a retry would get this"])
    started = time.monotonic()
    settled = harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    assert settled["status"] == "failed"
    assert settled["error"]["type"] == "stream_silent"
    assert time.monotonic() - started < 4.5  # CORRAL_STREAM_IDLE_SECONDS=1.5
    assert len(model.requests(conv)) == 1


def test_a_stream_past_its_cap_fails_without_retry(
    harness: Harness, model: Model, conv: str
) -> None:
    # Events arrive every 0.4 s (never silent for 1.5 s) but the stream lasts ~8 s (cap 3 s).
    model.script(conv, [{"text": "x" * 24 * 20, "event_delay": 0.4}, "retry"])
    settled = harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    assert settled["status"] == "failed"
    assert settled["error"]["type"] == "stream_timeout"
    assert len(model.requests(conv)) == 1


@pytest.mark.parametrize(
    ("model_name", "agent_cap", "expected"),
    [
        ("corral-scripted", None, 32000),
        ("claude-3-5-haiku-latest", None, 8192),
        ("claude-sonnet-4-5", 1500, 1500),
    ],
)
def test_output_tokens_are_clamped(
    harness: Harness,
    model: Model,
    conv: str,
    model_name: str,
    agent_cap: int | None,
    expected: int,
) -> None:
    spec: dict[str, Any] = {**AGENT, "model": model_name}
    if agent_cap:
        spec["limits"] = {"maxOutputTokens": agent_cap}
    model.script(conv, ["ok"])
    harness.wait_settled(conv, harness.admit(conv, spec=spec)["submissionId"])
    assert model.requests(conv)[0]["max_tokens"] == expected


def test_the_thinking_level_goes_with_every_generation(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            {"tool_use": {"name": "bash", "input": {"command": "true"}}},
            {"tool_use": {"name": "bash", "input": {"command": "true"}}},
            "done",
            "second submission",
        ],
    )
    harness.wait_settled(conv, harness.admit(conv, thinkingLevel="high")["submissionId"])
    second = harness.admit(conv)  # no override: the Agent's level (medium)
    harness.wait_settled(conv, second["submissionId"], second["offset"])
    budgets = [r["thinking"].get("budget_tokens") for r in model.requests(conv)]
    assert budgets == [16000, 16000, 16000, 4096]


def test_tool_results_reach_the_model_and_a_scenario_can_branch_on_them(
    harness: Harness, model: Model, conv: str
) -> None:
    (harness.root / "notes.md").write_text("alpha\nbeta needle\n")
    model.script(
        conv,
        [
            {"tool_use": {"name": "grep", "input": {"pattern": "needle"}}},
            {
                "when": {"tool_result_contains": "notes.md:2:beta needle"},
                "text": "found it",
                "otherwise": "grep did not work",
            },
        ],
    )
    settled = harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    assert settled["text"] == "found it"


def test_thinking_tool_use_and_usage_with_cache_come_back_whole(
    harness: Harness, model: Model, conv: str
) -> None:
    """A signed thinking block, text and a tool call in one answer: the next request sends the
    answer back as it came; usage (cache reads and writes too) is summed over both answers and
    priced from the catalog."""
    usage = {
        "input_tokens": 1000,
        "output_tokens": 100,
        "cache_read_input_tokens": 2000,
        "cache_creation_input_tokens": 400,
    }
    model.script(
        conv,
        [
            {
                "thinking": "I should look first.",
                "text": "Looking.",
                "tool_use": {"name": "bash", "input": {"command": "echo seen"}},
                "usage": usage,
            },
            {"text": "Seen.", "usage": usage},
        ],
    )
    spec = {**AGENT, "model": "claude-sonnet-4-5"}
    settled = harness.wait_settled(conv, harness.admit(conv, spec=spec)["submissionId"])
    assert settled["status"] == "completed" and settled["text"] == "Seen."
    first, second = model.requests(conv)
    assert first["thinking"]["type"] == "enabled"
    sent_back = second["messages"][1]
    assert sent_back["role"] == "assistant"
    thinking, text, call = sent_back["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "I should look first."
    assert thinking["signature"]  # the provider's signature, or the block would be refused
    assert text == {"type": "text", "text": "Looking."}
    assert call["type"] == "tool_use" and call["input"] == {"command": "echo seen"}
    assert second["messages"][2]["content"][0]["content"] == "seen\n"
    # claude-sonnet-4-5: $3 input, $15 output, $0.30 cache read, $3.75 cache write per MTok.
    assert settled["usage"] == {
        "input": 2000,
        "output": 200,
        "cacheRead": 4000,
        "cacheWrite": 800,
        "cost": round((2000 * 3 + 200 * 15 + 4000 * 0.3 + 800 * 3.75) / 1e6, 10),
    }
