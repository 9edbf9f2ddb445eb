"""The wire: admission, the two views, long-poll, 400s and 404s, settlement fields, /readyz."""

from __future__ import annotations

import time

import httpx
import pytest

from tests._scripted import system_text, unmarked

from ._rig import AGENT, Harness, Model

pytestmark = pytest.mark.timeout(60)


def test_admit_then_long_poll_to_completed_settlement(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv, [{"text": "All done.", "usage": {"input_tokens": 1000, "output_tokens": 200}}]
    )
    spec = {**AGENT, "model": "claude-sonnet-4-5"}
    admitted = harness.admit(conv, "hello", spec=spec)
    assert admitted["streamUrl"] == f"/agents/agent/{conv}/updates"
    assert admitted["submissionId"].startswith("sub_")
    settled = harness.wait_settled(conv, admitted["submissionId"], admitted["offset"])
    assert settled["status"] == "completed"
    assert settled["text"] == "All done."
    assert "error" not in settled
    # Cost comes from the catalog: 1000 input at $3/MTok + 200 output at $15/MTok.
    assert settled["usage"] == {
        "input": 1000,
        "output": 200,
        "cacheRead": 0,
        "cacheWrite": 0,
        "cost": 0.006,
    }
    kinds = [e["type"] for e in harness.history(conv)]
    # The ledger's start comes right after the submission starts; the turn's shape events
    # (docs/turns.md) may come between it and the one model answer.
    assert kinds[:2] == ["submission_started", "turn_started"] and kinds[-1] == "settled"
    assert kinds.count("message") == 1
    offsets = [e["offset"] for e in harness.history(conv)]
    assert offsets == list(range(len(kinds)))


def test_long_poll_waits_for_an_event_and_returns_at_timeout(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, [{"text": "late", "delay": 0.8}])
    admitted = harness.admit(conv)
    settled = harness.wait_settled(conv, admitted["submissionId"])
    end = settled["offset"] + 1
    started = time.monotonic()
    response = harness.get(f"/agents/agent/{conv}/updates", params={"offset": end, "wait": 0.5})
    waited = time.monotonic() - started
    assert response.json() == {"events": [], "offset": end}
    assert 0.4 <= waited < 3
    # A poll with a later arrival returns as soon as the event exists.
    model.script(conv, [{"text": "second"}])
    second = harness.admit(conv)
    assert second["offset"] == end
    response = harness.get(f"/agents/agent/{conv}/updates", params={"offset": end, "wait": 10})
    assert response.json()["events"][0]["type"] == "submission_started"


def test_unknown_conversation_is_404_on_both_views(harness: Harness, conv: str) -> None:
    for view in ("updates", "history"):
        response = harness.get(f"/agents/agent/{conv}/{view}")
        assert response.status_code == 404
        assert "no conversation" in response.json()["reason"]


def test_kept_admission_on_unknown_conversation_is_404_and_creates_nothing(
    harness: Harness, model: Model, conv: str
) -> None:
    response = harness.post(f"/agents/agent/{conv}", {"message": "x", "kept": True, "agent": AGENT})
    assert response.status_code == 404
    assert response.json()["kept"] is False
    assert harness.get(f"/agents/agent/{conv}/history").status_code == 404
    assert not (harness.state_dir / "conversations" / "agent" / conv).exists()
    # Once the conversation exists, kept: true admits into it.
    model.script(conv, ["one", "two"])
    first = harness.admit(conv)
    harness.wait_settled(conv, first["submissionId"])
    again = harness.admit(conv, kept=True)
    assert harness.wait_settled(conv, again["submissionId"])["text"] == "two"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"message": "x", "model": "gpt-nope", "agent": AGENT}, "unknown model 'gpt-nope'"),
        ({"message": "x", "agent": {**AGENT, "model": "nope"}}, "unknown model 'nope'"),
        ({"message": "x", "thinkingLevel": "extreme", "agent": AGENT}, "thinkingLevel"),
        ({"agent": AGENT}, "message"),
        ({"message": "", "agent": AGENT}, "message"),
        ({"message": "x", "surprise": 1, "agent": AGENT}, "surprise"),
        ({"message": "x", "agent": {"model": "corral-scripted"}}, "identity"),
    ],
)
def test_bad_admission_is_400_with_a_reason(
    harness: Harness, conv: str, body: dict[str, object], reason: str
) -> None:
    response = harness.post(f"/agents/agent/{conv}", body)
    assert response.status_code == 400
    assert reason in response.json()["reason"]
    assert harness.get(f"/agents/agent/{conv}/history").status_code == 404


def test_unparsable_admission_and_bad_names_are_400(harness: Harness, conv: str) -> None:
    response = httpx.post(f"{harness.url}/agents/agent/{conv}", content=b"{not json")
    assert response.status_code == 400
    assert "invalid JSON" in response.json()["reason"]
    response = harness.post("/agents/agent/..%2Fescape", {"message": "x", "agent": AGENT})
    assert response.status_code in (400, 404)
    response = harness.post("/agents/-bad/conv", {"message": "x", "agent": AGENT})
    assert response.status_code == 400
    assert "agent name" in response.json()["reason"]


def test_bad_query_parameters_are_400(harness: Harness, model: Model, conv: str) -> None:
    model.script(conv, ["ok"])
    harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    for params in ({"offset": "abc"}, {"wait": "soon"}, {"offset": -1}):
        response = harness.get(f"/agents/agent/{conv}/updates", params=params)
        assert response.status_code == 400, params
        assert response.json()["reason"]


def test_readyz_and_metrics(harness: Harness, model: Model, conv: str) -> None:
    assert httpx.get(f"{harness.url}/readyz").json() == {"ready": True}
    model.script(conv, ["ok"])
    harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    text = harness.get("/metrics").text
    assert 'corral_harness_submissions_total{status="completed"}' in text
    assert "corral_harness_model_answers_total" in text


def test_admission_carries_the_conversation_id_to_the_model(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, ["ok"])
    harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    (request,) = model.requests(conv)
    assert request["metadata"]["user_id"] == conv
    # The assembled context: identity first, the Agent's instructions in their own layer.
    system = system_text(request)
    assert system.index("You are a test agent.") < system.index("Be brief.")
    assert unmarked(request["messages"]) == [
        {"role": "user", "content": [{"type": "text", "text": "go"}]}
    ]
