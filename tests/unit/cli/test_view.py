"""The terminal views: what each event becomes, and the usage and cost so far."""

from __future__ import annotations

import io
import json
from typing import Any

from rich.console import Console

from corral_cli._view import JsonView, LiveView, PlainView, Tally, choose_view, describe

EVENTS: list[dict[str, Any]] = [
    {"source": "driver", "type": "admitted", "turn": 1, "submissionId": "s1", "message": "Fix"},
    {"offset": 0, "type": "submission_started", "submissionId": "s1"},
    {
        "offset": 1,
        "type": "message",
        "submissionId": "s1",
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Looking."}],
        "usage": {"input": 100, "output": 20, "cacheRead": 0, "cacheWrite": 0, "cost": 0.01},
    },
    {
        "offset": 2,
        "type": "tool_start",
        "submissionId": "s1",
        "toolUseId": "t1",
        "name": "bash",
        "input": {"command": "make test"},
    },
    {
        "offset": 3,
        "type": "tool_end",
        "submissionId": "s1",
        "toolUseId": "t1",
        "name": "bash",
        "isError": True,
        "result": "1 failed\n\n2 passed",
    },
    {
        "offset": 4,
        "type": "tool_blocked",
        "submissionId": "s1",
        "toolUseId": "t2",
        "name": "write",
        "outcome": "deny",
        "reason": "outside the granted root",
    },
    {
        "offset": 5,
        "type": "approval_requested",
        "submissionId": "s1",
        "approvalId": "a1",
        "toolUseId": "t3",
        "name": "land",
    },
]
SETTLED = {
    "source": "driver",
    "type": "settled",
    "turn": 1,
    "submissionId": "s1",
    "status": "completed",
    "error": None,
    "usage": {"input": 150, "output": 30, "cacheRead": 5, "cacheWrite": 0, "cost": 0.02},
    "evaluation": {"passed": False, "summary": "`make test` failed (exit 1)"},
    "decision": {"action": "continue", "phase": "Running", "message": "again"},
}


def test_each_event_reads_as_one_line() -> None:
    lines = [describe(e) for e in EVENTS]
    texts = [line[1] for line in lines if line]
    assert texts == [
        "turn 1 admitted: Fix",
        "assistant: Looking.",
        "▶ bash make test",
        "  ◀ error: 1 failed 2 passed",
        "✖ write deny: outside the granted root",
        "? approval requested for land (a1)",
    ]
    assert describe(EVENTS[1]) is None


def test_usage_counts_the_turn_in_flight_then_the_settlement_replaces_it() -> None:
    buffer = io.StringIO()
    view = PlainView(buffer)
    for event in EVENTS:
        view.event(event)
    assert view.tally.total("input") == 100 and view.tally.phase == "WaitingForHuman"
    view.event(SETTLED)
    # The settlement's usage is the whole turn's; the in-flight estimate is not added twice.
    assert view.tally.total("input") == 150 and view.tally.total("cost") == 0.02
    assert view.tally.tools_run == 1 and view.tally.tools_blocked == 1
    out = buffer.getvalue()
    assert "evaluation FAIL: `make test` failed (exit 1)" in out
    assert "usage: tokens in 150 out 30 cache r/w 5/0  cost $0.0200" in out


def test_a_long_argument_or_result_is_cut_to_one_line() -> None:
    line = describe({"type": "tool_end", "name": "read", "isError": False, "result": "x" * 999})
    assert line is not None and len(line[1]) < 260 and line[1].endswith("…")


def test_json_view_is_one_object_per_line() -> None:
    out = io.StringIO()
    with JsonView(out) as view:
        for event in EVENTS:
            view.event(event)
        view.outcome({"phase": "Succeeded", "message": "ok"})
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[:-1] == EVENTS
    assert lines[-1] == {"type": "outcome", "phase": "Succeeded", "message": "ok"}


def test_live_view_shows_phase_turn_and_cost_on_a_terminal() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120, color_system=None)
    with LiveView("corral run · demo", console) as view:
        for event in [*EVENTS, SETTLED]:
            view.event(event)
        view.outcome({"phase": "Succeeded", "message": "evaluation passed"})
    out = buffer.getvalue()
    assert "▶ bash make test" in out and "assistant: Looking." in out
    assert "phase Running" in out and "turn 1" in out and "cost $0.0200" in out
    assert "Succeeded: evaluation passed" in out


def test_a_pipe_gets_plain_lines() -> None:
    assert isinstance(choose_view("t", json_lines=False, out=io.StringIO()), PlainView)
    assert isinstance(choose_view("t", json_lines=True, out=io.StringIO()), JsonView)


def test_tally_ignores_non_numbers() -> None:
    tally = Tally()
    tally.add_message({"input": 3, "note": "x"})
    assert tally.total("input") == 3 and "note" not in tally.in_flight
