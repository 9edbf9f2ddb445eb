"""The turn's ledger, the runaway watch and steering, through the wire: the real harness
process, its default engine, the scripted model (docs/ledger.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral_api.wire import TURN_RECEIPT_KEYS, SteerRequest, TurnReceipt

from ._rig import AGENT, Harness, Model

pytestmark = pytest.mark.timeout(60)

BASH = "bash"


def _bash(command: str, call_id: str | None = None) -> dict[str, Any]:
    use: dict[str, Any] = {"name": BASH, "input": {"command": command}}
    if call_id:
        use["id"] = call_id
    return use


def _events(harness: Harness, conv: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in harness.history(conv) if e["type"] == kind]


def _tool_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for message in request["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


def test_the_settled_event_carries_every_ledger_field(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            {"tool_use": _bash("echo hi"), "usage": {"input_tokens": 100, "output_tokens": 20}},
            {"tool_use": {"name": "write", "input": {"path": "../x", "content": "no"}}},
            {"text": "done", "usage": {"input_tokens": 150, "output_tokens": 5}},
        ],
    )
    # A fixed reactive loop (loop: auto's scheduler is docs/turns.md's); ../x is outside the root.
    spec = {**AGENT, "loop": "reactive", "tools": {"allow": ["bash", "write"]}}
    admitted = harness.admit(conv, "say hi", spec=spec, runId="run-ledger-1")
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["status"] == "completed", settled
    receipt = settled["receipt"]
    assert set(receipt) == TURN_RECEIPT_KEYS
    TurnReceipt.model_validate(receipt)  # the normative shape
    assert receipt["requestedLoop"] == "reactive"
    assert receipt["route"] == "reactive" and receipt["handler"] == "reactive"
    assert receipt["toolsRun"] == ["bash"]
    assert receipt["toolsBlocked"] == ["write"]
    # The reactive loop's tokens are booked to its own layer; the others stay at zero.
    reactive = receipt["tokensByLayer"]["reactive"]
    assert reactive >= 100 + 20 + 150 + 5
    assert receipt["tokensByLayer"]["classifier"] == receipt["tokensByLayer"]["executor"] == 0
    assert receipt["outcome"] == "success"
    assert receipt["phasePath"][-2:] == ["answer", "done"] and "execute" in receipt["phasePath"]
    assert receipt["steps"] == 2 and isinstance(receipt["contextTokens"], dict)
    # The ledger's start: a turn_started event with the run id the caller gave.
    (started,) = _events(harness, conv, "turn_started")
    assert started["runId"] == "run-ledger-1" and started["requestedLoop"] == "reactive"
    # The same receipt is the turn's record on the state volume.
    record_file = harness.state_dir / "turns" / conv / "turn-1.json"
    record = json.loads(record_file.read_text())
    assert record["submissionId"] == admitted["submissionId"]
    assert {k: record[k] for k in TURN_RECEIPT_KEYS} == receipt
    # Every model request went out with the run id (the custodian logs it).
    sent = [r for r in model.scripted.requests if r["conversation"] == conv]
    assert {r["headers"].get("x-corral-run-id") for r in sent} == {"run-ledger-1"}


def test_the_runaway_watch_trips_on_the_step_cap(harness: Harness, model: Model, conv: str) -> None:
    model.script(
        conv,
        [
            {"tool_uses": [_bash("echo 1 >> log"), _bash("echo 2 >> log")]},
            {"tool_uses": [_bash("echo 3 >> log"), _bash("echo 4 >> log"), _bash("echo 5")]},
            "never asked",
        ],
    )
    spec = {**AGENT, "limits": {"maxStepsPerTurn": 3}}
    admitted = harness.admit(conv, "loop", spec=spec)
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["status"] == "failed"
    assert settled["error"]["type"] == "runaway"
    assert "maxStepsPerTurn" in settled["error"]["message"]
    # Three calls ran; the fourth tripped the watch at its start: it and the fifth never ran
    # and carry the did-not-run answer in the transcript.
    assert (harness.root / "log").read_text().split() == ["1", "2", "3"]
    receipt = settled["receipt"]
    assert receipt["steps"] == 4 and receipt["toolsRun"] == [BASH] * 3
    assert receipt["outcome"] == "partial" and receipt["phasePath"][-1] == "failed"
    assert len(model.requests(conv)) == 2
    # The next turn starts from a valid transcript: every call of the last answer answered.
    model.script(conv, ["ok"])
    again = harness.admit(conv, "go on", spec=spec)
    assert harness.wait_settled(conv, again["submissionId"])["status"] == "completed"
    last = model.requests(conv)[-1]
    results = _tool_results(last)
    assert len(results) == 5
    assert all("did not run" in str(r["content"]) for r in results[3:])


def test_the_runaway_watch_trips_on_the_token_cap(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            {"tool_use": _bash("echo a"), "usage": {"input_tokens": 900, "output_tokens": 200}},
            "never asked",
        ],
    )
    spec = {**AGENT, "limits": {"maxTokensPerTurn": 1000}}
    admitted = harness.admit(conv, "spend", spec=spec)
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["status"] == "failed" and settled["error"]["type"] == "runaway"
    assert "maxTokensPerTurn" in settled["error"]["message"]
    assert settled["receipt"]["toolsRun"] == [] and len(model.requests(conv)) == 1


def test_an_agent_limit_out_of_range_is_a_400(harness: Harness, conv: str) -> None:
    spec = {**AGENT, "limits": {"maxStepsPerTurn": 0}}
    response = harness.post(f"/agents/agent/{conv}", {"message": "x", "agent": spec})
    assert response.status_code == 400
    assert "maxStepsPerTurn" in response.json()["reason"]


def test_a_steer_changes_the_thinking_level_and_adds_a_message_mid_turn(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, [{"tool_use": _bash("sleep 1; echo slept")}, "first done", "second done"])
    admitted = harness.admit(conv, "work", spec={**AGENT, "thinkingLevel": "low"})
    harness.wait_for(conv, "tool_start")
    steered = harness.post(
        f"/agents/agent/{conv}/steer",
        {"message": "also check the README", "thinkingLevel": "high"},
    )
    assert steered.status_code == 200, steered.text
    assert steered.json() == {"steered": True, "submissionId": admitted["submissionId"]}
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["receipt"]["thinkingLevel"] == "high"
    first, second = model.requests(conv)
    assert first["thinking"]["budget_tokens"] == 1024  # low
    assert second["thinking"]["budget_tokens"] == 16000  # high, from the steer on
    # The steer is a user message after the call's result (never between call and result).
    last_user = second["messages"][-1]
    texts = [b.get("text") for b in last_user["content"] if b.get("type") == "text"]
    assert "also check the README" in texts
    assert _tool_results(second)[0]["tool_use_id"]
    # A later turn that names no level keeps the steered one (a wait keeps its level).
    later = harness.admit(conv, "and now", spec={**AGENT, "thinkingLevel": "low"})
    harness.wait_settled(conv, later["submissionId"])
    assert model.requests(conv)[-1]["thinking"]["budget_tokens"] == 16000


def test_a_steer_without_a_turn_in_flight_is_a_409(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, ["hi"])
    harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    response = harness.post(f"/agents/agent/{conv}/steer", {"thinkingLevel": "high"})
    assert response.status_code == 409 and response.json()["error"] == "no_turn"
    unknown = harness.post("/agents/agent/no-such-conv/steer", {"thinkingLevel": "high"})
    assert unknown.status_code == 404


@pytest.mark.parametrize(
    "body",
    [{}, {"thinkingLevel": "extreme"}, {"message": ""}, {"message": "x", "extra": 1}],
    ids=["empty", "bad-level", "empty-message", "unknown-key"],
)
def test_a_bad_steer_is_a_400_with_a_reason(
    harness: Harness, model: Model, conv: str, body: dict[str, Any]
) -> None:
    model.script(conv, [{"tool_use": _bash("sleep 1")}, "done"])
    admitted = harness.admit(conv)
    harness.wait_for(conv, "tool_start")
    response = harness.post(f"/agents/agent/{conv}/steer", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "bad_request" and response.json()["reason"]
    with pytest.raises(ValueError):
        SteerRequest.model_validate(body)
    harness.wait_settled(conv, admitted["submissionId"])


def test_a_steer_naming_another_submission_is_refused(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, [{"tool_use": _bash("sleep 1")}, "done"])
    admitted = harness.admit(conv)
    harness.wait_for(conv, "tool_start")
    response = harness.post(
        f"/agents/agent/{conv}/steer", {"message": "hey", "submissionId": "sub-other"}
    )
    assert response.status_code == 409
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert not _events(harness, conv, "steered") and settled["status"] == "completed"
