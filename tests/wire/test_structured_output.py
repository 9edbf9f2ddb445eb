"""Structured output through the wire: the real harness, the real SDK, the scripted model.

The admission carries `outputSchema`; the final answer must be JSON valid for it; an invalid
answer goes back to the model with the validation errors at most twice, then the turn fails
`output_invalid`; the validated object is the settled event's `output`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ._rig import AGENT, Harness, Model

pytestmark = pytest.mark.timeout(60)

REVIEW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["verdict", "findings"],
    "additionalProperties": False,
    "properties": {
        "verdict": {"enum": ["approve", "request_changes"]},
        "findings": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
}
VALID = {"verdict": "approve", "findings": ["tests pass"]}


def _user_texts(request: dict[str, Any]) -> list[str]:
    texts = []
    for message in request["messages"]:
        if message["role"] != "user" or isinstance(message["content"], str):
            continue
        texts += [b.get("text", "") for b in message["content"] if b.get("type") == "text"]
    return texts


def _system_text(request: dict[str, Any]) -> str:
    system = request.get("system") or ""
    if isinstance(system, list):
        return "".join(block.get("text", "") for block in system)
    return str(system)


def test_a_valid_first_answer_settles_completed_with_the_object(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, [json.dumps(VALID)])
    admitted = harness.admit(conv, "review the change", outputSchema=REVIEW_SCHEMA)
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["status"] == "completed", settled
    assert settled["output"] == VALID
    (request,) = model.requests(conv)
    # The model is told the shape of its answer on the call itself (never in the transcript).
    assert "JSON Schema" in _system_text(request) and '"request_changes"' in _system_text(request)
    assert all("JSON Schema" not in text for text in _user_texts(request))


def test_a_fenced_answer_counts_and_no_schema_means_no_output(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, ["```json\n" + json.dumps(VALID) + "\n```", "plain prose, no schema"])
    first = harness.admit(conv, "review", outputSchema=REVIEW_SCHEMA)
    assert harness.wait_settled(conv, first["submissionId"])["output"] == VALID
    second = harness.admit(conv, "now chat")
    settled = harness.wait_settled(conv, second["submissionId"], offset=second["offset"])
    assert settled["status"] == "completed" and "output" not in settled
    assert "JSON Schema" not in _system_text(model.requests(conv)[-1])


def test_invalid_twice_then_valid_sends_back_the_errors_and_completes(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            "Looks good to me!",  # not JSON at all
            json.dumps({"verdict": "ship it", "findings": []}),  # JSON, not valid for the schema
            json.dumps({"verdict": "request_changes", "findings": ["missing test"]}),
        ],
    )
    admitted = harness.admit(conv, "review the change", outputSchema=REVIEW_SCHEMA)
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["status"] == "completed", settled
    assert settled["output"] == {"verdict": "request_changes", "findings": ["missing test"]}
    requests = model.requests(conv)
    assert len(requests) == 3
    # Each send-back names what is wrong, so the model can fix it.
    second_asks = _user_texts(requests[1])[-1]
    assert "not valid JSON" in second_asks
    third_asks = _user_texts(requests[2])[-1]
    assert "$.verdict" in third_asks and "'ship it' is not one of" in third_asks


def test_invalid_three_times_fails_output_invalid_with_the_errors(
    harness: Harness, model: Model, conv: str
) -> None:
    wrong = json.dumps({"verdict": "approve", "findings": ["a", "b", "c", "d"], "extra": 1})
    model.script(conv, [wrong, wrong, wrong, "never asked"])
    admitted = harness.admit(conv, "review the change", outputSchema=REVIEW_SCHEMA)
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["status"] == "failed"
    assert settled["error"]["type"] == "output_invalid"
    message = settled["error"]["message"]
    assert "$.findings" in message and "is too long" in message
    assert "'extra' was unexpected" in message and "sent back 2 times" in message
    assert "output" not in settled
    assert len(model.requests(conv)) == 3  # the first answer and two send-backs, no more


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ("an object please", "Input should be a valid dictionary"),
        ({"type": "objekt"}, "not a valid JSON Schema at type"),
        ({"properties": {"x": {"minLength": -1}}}, "not a valid JSON Schema at properties/x"),
        ({"description": "x" * 40_000}, "at most 32768 are allowed"),
    ],
)
def test_a_bad_output_schema_is_a_400_at_admission(
    harness: Harness, conv: str, schema: Any, expected: str
) -> None:
    response = harness.post(
        f"/agents/agent/{conv}", {"message": "go", "agent": AGENT, "outputSchema": schema}
    )
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"] == "bad_request"
    assert "outputSchema" in body["reason"] and expected in body["reason"]
    # Nothing was created.
    assert harness.get(f"/agents/agent/{conv}/history").status_code == 404


def test_a_queued_submission_keeps_its_schema_across_a_restart(
    fresh_harness: Harness, model: Model, conv: str
) -> None:
    harness = fresh_harness
    harness.start()
    model.script(conv, [{"tool_use": {"name": "bash", "input": {"command": "sleep 30"}}}])
    first = harness.admit(conv, "slow")
    harness.wait_for(conv, "tool_start")
    queued = harness.admit(conv, "review", outputSchema=REVIEW_SCHEMA)
    harness.kill9()
    model.script(conv, [json.dumps(VALID)])
    harness.start()
    assert harness.wait_settled(conv, first["submissionId"])["status"] == "failed"
    settled = harness.wait_settled(conv, queued["submissionId"])
    assert settled["status"] == "completed", settled
    assert settled["output"] == VALID
