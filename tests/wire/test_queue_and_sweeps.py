"""The per-conversation queue, the abort sweep and its causes, and picks."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from ._rig import Harness, MenuStandIn, Model

pytestmark = pytest.mark.timeout(60)


def _settled(harness: Harness, conv: str) -> list[dict[str, Any]]:
    return [e for e in harness.history(conv) if e["type"] == "settled"]


def test_submissions_run_one_at_a_time_in_admission_order(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, [{"text": "first", "delay": 0.4}, {"text": "second"}, {"text": "third"}])
    ids = [harness.admit(conv, f"m{i}")["submissionId"] for i in range(3)]
    harness.wait_settled(conv, ids[2])
    events = harness.history(conv)
    started = [e["submissionId"] for e in events if e["type"] == "submission_started"]
    settled = [(e["submissionId"], e["text"]) for e in events if e["type"] == "settled"]
    assert started == ids
    assert settled == list(zip(ids, ["first", "second", "third"], strict=True))
    # No overlap: each submission starts only after the one before it settled.
    order = [
        (e["type"], e["submissionId"])
        for e in events
        if e["type"] in ("submission_started", "settled")
    ]
    assert order == [(kind, sid) for sid in ids for kind in ("submission_started", "settled")]
    # Each prompt reached the model in admission order.
    prompts = [r["messages"][-1]["content"][-1]["text"] for r in model.requests(conv)]
    assert prompts == ["m0", "m1", "m2"]


def _busy(harness: Harness, model: Model, conv: str, queued: int = 2) -> list[str]:
    """An active submission stuck in a slow model call, with `queued` more behind it."""
    model.script(conv, [{"text": "never seen", "delay": 30}])
    ids = [harness.admit(conv, f"m{i}")["submissionId"] for i in range(queued + 1)]
    model.wait_requests(conv, 1)
    return ids


@pytest.mark.parametrize(
    "body",
    [
        None,
        b"{not json",
        {"cause": "timeout"},
        {"cause": "pick"},
        {"cause": "pick", "submissionId": "sub_someone_else"},
        {"submissionId": "ACTIVE"},
    ],
    ids=["no-body", "unparsable", "unknown-cause", "pick-without-id", "pick-other-id", "no-cause"],
)
def test_a_sweep_without_a_pick_for_the_active_settles_everything_aborted(
    harness: Harness, model: Model, conv: str, body: Any
) -> None:
    ids = _busy(harness, model, conv)
    if isinstance(body, dict) and body.get("submissionId") == "ACTIVE":
        body = {"submissionId": ids[0]}
    if isinstance(body, bytes):
        response = httpx.post(f"{harness.url}/agents/agent/{conv}/abort", content=body)
        assert response.json() == {"aborted": True}
    else:
        assert harness.abort(conv, body) is True
    settled = _settled(harness, conv)
    assert [e["submissionId"] for e in settled] == ids
    for event in settled:
        assert event["status"] == "aborted"
        assert event["error"]["type"] == "submission_aborted"
        assert "usage" not in event  # the model never answered
    # Nothing of the swept queue ever started.
    started = [
        e["submissionId"] for e in harness.history(conv) if e["type"] == "submission_started"
    ]
    assert started == ids[:1]


def test_a_pick_sweep_naming_the_active_settles_it_ended_and_the_queue_aborted(
    harness: Harness, model: Model, conv: str
) -> None:
    ids = _busy(harness, model, conv)
    assert harness.abort(conv, {"cause": "pick", "submissionId": ids[0]}) is True
    settled = _settled(harness, conv)
    assert [(e["submissionId"], e["status"]) for e in settled] == [
        (ids[0], "ended"),
        (ids[1], "aborted"),
        (ids[2], "aborted"),
    ]
    assert "error" not in settled[0]
    assert settled[1]["error"] == {
        "type": "submission_aborted",
        "message": settled[1]["error"]["message"],
    }


def test_abort_is_false_when_idle_or_unknown(harness: Harness, model: Model, conv: str) -> None:
    assert harness.abort(conv) is False
    assert harness.get(f"/agents/agent/{conv}/history").status_code == 404
    model.script(conv, ["done"])
    harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    assert harness.abort(conv) is False


def test_a_submission_admitted_after_a_sweep_runs(
    harness: Harness, model: Model, conv: str
) -> None:
    ids = _busy(harness, model, conv, queued=0)
    assert harness.abort(conv)
    model.script(conv, ["fresh"])
    after = harness.admit(conv, "again")
    settled = harness.wait_settled(conv, after["submissionId"], after["offset"])
    assert settled["status"] == "completed"
    assert [e["submissionId"] for e in _settled(harness, conv)] == [ids[0], after["submissionId"]]


def _menu(menu: tuple[MenuStandIn, str], conv: str, *, ends_turn: bool = True) -> MenuStandIn:
    stand_in = menu[0]
    stand_in.surfaces[conv] = [
        {
            "name": "publish",
            "description": "Publish the work and end the turn.",
            "input_schema": {"type": "object", "properties": {"note": {"type": "string"}}},
            "pick": True,
        },
        {
            "name": "finish",
            "description": "Finish.",
            "input_schema": {"type": "object"},
            "pick": True,
        },
        {
            "name": "status",
            "description": "Child status.",
            "input_schema": {"type": "object"},
            "pick": False,
        },
    ]
    stand_in.answers[(conv, "publish")] = {"content": "published", "endsTurn": ends_turn}
    return stand_in


def test_a_pick_that_ends_the_turn_waits_for_the_sweep_and_blocks_later_calls(
    harness: Harness, model: Model, menu: tuple[MenuStandIn, str], conv: str
) -> None:
    stand_in = _menu(menu, conv)
    model.script(
        conv,
        [
            {
                "tool_uses": [
                    {"name": "mcp__corral__publish", "input": {"note": "v1"}},
                    {"name": "bash", "input": {"command": "touch after-pick"}},
                ]
            }
        ],
    )
    admitted = harness.admit(conv)
    blocked = harness.wait_for(conv, "tool_blocked")
    assert blocked["name"] == "bash"
    assert "pick ended the turn" in blocked["reason"]
    time.sleep(0.3)
    assert _settled(harness, conv) == []  # waiting for the sweep, not settled
    assert harness.abort(conv, {"cause": "pick", "submissionId": admitted["submissionId"]})
    (settled,) = _settled(harness, conv)
    assert settled["status"] == "ended"
    assert [(c, n) for c, n, _ in stand_in.calls if c == conv] == [(conv, "publish")]
    assert not (harness.root / "after-pick").exists()
    assert len(model.requests(conv)) == 1  # no model request after the pick ended the turn
    assert stand_in.surface_reads.count(conv) == 1


def test_a_pick_without_a_sweep_settles_aborted_after_the_wait(
    harness: Harness, model: Model, menu: tuple[MenuStandIn, str], conv: str
) -> None:
    _menu(menu, conv)
    model.script(conv, [{"tool_use": {"name": "mcp__corral__publish", "input": {}}}])
    admitted = harness.admit(conv)
    started = time.monotonic()
    settled = harness.wait_settled(conv, admitted["submissionId"])
    waited = time.monotonic() - started
    assert settled["status"] == "aborted"
    assert "no sweep came within 1.5 s" in settled["error"]["message"]
    assert 1.4 <= waited < 6  # CORRAL_PICK_SWEEP_SECONDS=1.5 in this rig


def test_only_the_first_pick_of_a_model_answer_runs(
    harness: Harness, model: Model, menu: tuple[MenuStandIn, str], conv: str
) -> None:
    stand_in = _menu(menu, conv, ends_turn=False)
    model.script(
        conv,
        [
            {
                "tool_uses": [
                    {"name": "mcp__corral__status", "input": {}},
                    {"name": "mcp__corral__publish", "input": {}},
                    {"name": "mcp__corral__finish", "input": {}},
                ]
            },
            "after the picks",
        ],
    )
    admitted = harness.admit(conv)
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["status"] == "completed"
    assert [n for c, n, _ in stand_in.calls if c == conv] == ["status", "publish"]
    ends = [e for e in harness.history(conv) if e["type"] == "tool_end"]
    assert [(e["name"], e["isError"]) for e in ends] == [
        ("mcp__corral__status", False),
        ("mcp__corral__publish", False),
        ("mcp__corral__finish", True),
    ]
    results = model.requests(conv)[1]["messages"][-1]["content"]
    assert "only the first pick" in results[2]["content"]


def test_the_menu_is_read_afresh_for_every_submission(
    harness: Harness, model: Model, menu: tuple[MenuStandIn, str], conv: str
) -> None:
    stand_in = _menu(menu, conv)
    model.script(conv, ["one", "two"])
    harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    stand_in.surfaces[conv] = [
        {"name": "spawn", "description": "Spawn a child.", "input_schema": {"type": "object"}}
    ]
    harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    first, second = ({t["name"] for t in r["tools"]} for r in model.requests(conv))
    assert "mcp__corral__publish" in first and "mcp__corral__spawn" not in first
    assert "mcp__corral__spawn" in second and "mcp__corral__publish" not in second
    assert {"read", "write", "edit", "bash", "grep", "glob"} <= second
