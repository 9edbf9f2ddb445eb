"""`corral run`'s view of the turn's ledger and of a steer (docs/ledger.md)."""

from __future__ import annotations

import io

from corral_cli._view import PlainView, describe

RECEIPT = {
    "requestedLoop": "auto",
    "handler": "reactive",
    "route": "reactive",
    "toolsRun": ["bash", "bash", "bash"],
    "toolsBlocked": [],
    "tokensByLayer": {"classifier": 0, "planner": 0, "reactive": 1200, "executor": 0},
    "outcome": "partial",
    "phasePath": ["execute", "failed"],
}


def test_the_harness_settlement_shows_the_ledger_and_a_runaway() -> None:
    event = {
        "type": "settled",
        "submissionId": "s1",
        "status": "failed",
        "error": {"type": "runaway", "message": "more than 3 tool calls"},
        "receipt": RECEIPT,
    }
    described = describe(event)
    assert described is not None
    style, line = described
    assert style == "yellow"
    assert "ledger: partial via reactive (asked auto, ran reactive)" in line
    assert "3 tools run, 0 blocked; tokens reactive 1200" in line
    assert "phases: execute → failed" in line and "runaway: more than 3 tool calls" in line
    out = io.StringIO()
    with PlainView(out) as view:
        view.event(event)
    assert "ledger: partial" in out.getvalue()


def test_a_steer_is_a_line() -> None:
    described = describe({"type": "steered", "thinkingLevel": "high", "message": "also docs"})
    assert described == ("magenta", "↪ steered (thinking high): also docs")
