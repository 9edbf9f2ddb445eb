"""The wire client against a stand-in harness (an httpx MockTransport, named as such).

The stand-in plays what the real harness cannot be made to do on demand here: refuse
connections, answer 503, lose a conversation. The real harness is driven in tests/e2e_local.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from corral_api.kinds import AdmissionLedger
from corral_api.wire import AdmitRequest
from corral_operator.wireclient import (
    AdmissionRejected,
    ConversationLost,
    SettlementFault,
    WireClient,
    WireRequestFailed,
)

Handler = Callable[[httpx.Request], httpx.Response]


def client(handler: Handler) -> WireClient:
    return WireClient(
        "http://harness.invalid:8080",
        "fixer",
        token="s3cret",
        poll_wait=0.01,
        backoff_initial=0.001,
        backoff_cap=0.004,
        transport=httpx.MockTransport(handler),
    )


LEDGER = AdmissionLedger(
    stream_url="http://10.0.0.9:8080/agents/fixer/c1/updates", offset=3, submission_id="s2", turn=1
)


def settled(offset: int, status: str, submission: str = "s2") -> dict[str, object]:
    event: dict[str, object] = {
        "offset": offset,
        "type": "settled",
        "submissionId": submission,
        "status": status,
        "text": "done",
    }
    if status in ("failed", "aborted"):
        event["error"] = {"type": "submission_aborted", "message": "asked"}
    return event


async def test_wait_reconnects_through_refusals_and_outages_and_keeps_its_offset() -> None:
    seen: list[tuple[str, str, str]] = []
    answers: list[Callable[[], httpx.Response]] = [
        lambda: (_ for _ in ()).throw(httpx.ConnectError("refused")),
        lambda: httpx.Response(503, json={"error": "busy", "reason": "starting"}),
        lambda: httpx.Response(
            200,
            json={
                "events": [
                    {"offset": 3, "type": "tool_start", "submissionId": "s2", "name": "bash"},
                    settled(4, "completed", submission="s1"),  # another submission's settlement
                ],
                "offset": 5,
            },
        ),
        lambda: httpx.Response(200, json={"events": [], "offset": 5}),
        lambda: httpx.Response(200, json={"events": [settled(5, "completed")], "offset": 6}),
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(
            (request.url.path, request.url.params["offset"], request.headers["authorization"])
        )
        return answers.pop(0)()

    events: list[dict[str, object]] = []
    async with client(handler) as wire:
        result = await wire.wait("c1", LEDGER, events.append)
    assert result.status == "completed" and result.submissionId == "s2" and result.text == "done"
    # The stream URL's path is kept, its host is not: the client reaches the harness it knows.
    assert {path for path, _, _ in seen} == {"/agents/fixer/c1/updates"}
    assert [offset for _, offset, _ in seen] == ["3", "3", "3", "5", "5"]
    assert {auth for _, _, auth in seen} == {"Bearer s3cret"}
    assert [e["type"] for e in events] == ["tool_start", "settled", "settled"]


@pytest.mark.parametrize("status", ["failed", "ended", "aborted"])
async def test_wait_raises_a_settlement_fault_unless_completed(status: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"events": [settled(3, status)], "offset": 4})

    async with client(handler) as wire:
        with pytest.raises(SettlementFault) as caught:
            await wire.wait("c1", LEDGER)
    assert caught.value.settled.status == status


async def test_a_lost_conversation_is_a_typed_fault_not_an_endless_poll() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": "not_found", "reason": "unknown conversation"})

    async with client(handler) as wire:
        with pytest.raises(ConversationLost, match="unknown conversation"):
            await wire.wait("c1", LEDGER)
        with pytest.raises(ConversationLost):
            await wire.history("c1")


async def test_admission_refusals_carry_the_harness_reason() -> None:
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(400, json={"error": "bad_model", "reason": "unknown model 'gpt'"})

    async with client(handler) as wire:
        with pytest.raises(AdmissionRejected) as caught:
            await wire.admit("c1", AdmitRequest(message="hi", model="gpt"))
    assert caught.value.status_code == 400 and caught.value.reason == "unknown model 'gpt'"
    # Unset dials are omitted, not sent as null.
    assert bodies == [{"message": "hi", "model": "gpt", "kept": False}]


async def test_abort_sends_cause_and_submission_and_reads_the_answer() -> None:
    bodies: list[object] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.raw_path == b"/agents/fixer/c%201/abort"
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"aborted": True})

    async with client(handler) as wire:
        assert await wire.abort("c 1", cause="pick", submission_id="s2")
        assert await wire.abort("c 1")
    assert bodies == [{"cause": "pick", "submissionId": "s2"}, {}]


async def test_checks_and_their_refusal() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["command"] == "forbidden":
            return httpx.Response(401, json={"error": "unauthorized", "reason": "no token"})
        return httpx.Response(200, json={"exitCode": 1, "output": "FAILED", "timedOut": False})

    async with client(handler) as wire:
        result = await wire.checks("make test", 30)
        assert (result.exit_code, result.output, result.timed_out) == (1, "FAILED", False)
        with pytest.raises(WireRequestFailed, match="no token"):
            await wire.checks("forbidden")


async def test_updates_passes_a_5xx_up_as_a_typed_fault() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="kaboom")

    async with client(handler) as wire:
        with pytest.raises(WireRequestFailed, match="kaboom"):
            await wire.updates("c1", 0)
