"""A session outlives its pod (issue 27): the durable log read from record N, and a conversation
restored from it into another harness, where what was in flight settles `sandbox_lost`."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_api.wire import LOG_NEXT_HEADER
from corral_harness.engine.seam import DID_NOT_RUN

from ._rig import Harness, MenuStandIn, Model

pytestmark = pytest.mark.timeout(90)

TOKEN = "restore-test-token"


@pytest.fixture
def pair(
    tmp_path: Path, model: Model, menu: tuple[MenuStandIn, str]
) -> Iterator[tuple[Harness, Harness]]:
    """Two harnesses of their own state, both wanting the wire token: the lost pod's, the new."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    made = []
    for name in ("lost", "new"):
        (tmp_path / name / "state").mkdir(parents=True)
        (tmp_path / name / "root").mkdir()
        harness = Harness(model.url, menu[1], tmp_path / name / "state", tmp_path / name / "root")
        harness.extra_env["CORRAL_WIRE_TOKEN_FILE"] = str(token_file)
        harness.token = TOKEN
        made.append(harness)
    yield made[0], made[1]
    for harness in made:
        harness.stop()


def read_log(harness: Harness, conv: str, first: int) -> tuple[bytes, int]:
    response = harness.get(f"/agents/agent/{conv}/log", params={"from": first})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return response.content, int(response.headers[LOG_NEXT_HEADER])


def records_of(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.splitlines()]


def put_log(harness: Harness, conv: str, body: bytes) -> httpx.Response:
    return httpx.put(
        f"{harness.url}/agents/agent/{conv}/log",
        content=body,
        headers=harness.headers(),
        timeout=30,
    )


def test_a_conversation_restored_in_another_harness_resumes(
    pair: tuple[Harness, Harness], model: Model, conv: str
) -> None:
    lost, new = pair
    model.script(
        conv,
        [
            "first answer",
            {"tool_uses": [{"name": "bash", "input": {"command": "sleep 30"}}]},
            "the queued turn",
            "after the restore",
        ],
    )
    lost.start()
    done = lost.admit(conv, "one", idempotencyKey="turn-1")
    lost.wait_settled(conv, done["submissionId"])

    # The operator's first read, at the turn's end: every record so far, and where to go on.
    first, after_first = read_log(lost, conv, 0)
    assert after_first == len(records_of(first)) > 0
    assert records_of(first)[0]["k"] == "sub"
    assert records_of(first)[-1]["e"]["type"] == "settled"

    in_flight = lost.admit(conv, "two", idempotencyKey="turn-2")
    queued = lost.admit(conv, "queued")
    lost.wait_for(conv, "tool_start")
    second, after_second = read_log(lost, conv, after_first)
    assert after_second == after_first + len(records_of(second))
    opening = records_of(second)[0]
    assert (opening["k"], opening["id"]) == ("sub", in_flight["submissionId"])
    lost_events = [r["e"] for r in records_of(first + second) if r["k"] == "ev"]
    assert lost.history(conv)[: len(lost_events)] == lost_events
    # A read from the end is empty; one past it is a 400 naming both numbers.
    _, at_end = read_log(lost, conv, after_second)
    past = lost.get(f"/agents/agent/{conv}/log", params={"from": at_end + 5})
    assert past.status_code == 400
    assert str(at_end + 5) in past.json()["reason"] and str(at_end) in past.json()["reason"]
    lost.kill9()  # the pod is lost

    new.start()
    restored = put_log(new, conv, first + second)
    assert restored.status_code == 201, restored.text
    assert restored.json() == {
        "restored": True,
        "records": after_second,
        "events": len(lost_events),
        "interrupted": [in_flight["submissionId"]],
    }
    # A client waiting from the offset it was given before the loss reads the settlement next.
    waited = new.get(
        f"/agents/agent/{conv}/updates", params={"offset": in_flight["offset"], "wait": 5}
    ).json()["events"]
    seen_before = len(lost_events) - in_flight["offset"]
    assert waited[:seen_before] == lost_events[in_flight["offset"] :]
    settled = waited[seen_before]
    assert settled["type"] == "settled" and settled["offset"] == len(lost_events)
    assert settled["submissionId"] == in_flight["submissionId"]
    assert settled["status"] == "failed" and settled["error"]["type"] == "sandbox_lost"
    assert "pod was lost" in settled["error"]["message"]
    # What was admitted and had not started runs here, as after a restart.
    ran = new.wait_settled(conv, queued["submissionId"], settled["offset"])
    assert (ran["status"], ran["text"]) == ("completed", "the queued turn")
    history = new.history(conv)
    assert history[: len(lost_events)] == lost_events  # offsets, timestamps and all

    # The restore happens once.
    again = put_log(new, conv, first + second)
    assert again.status_code == 409 and again.json()["error"] == "conversation_exists"

    # A settled submission stays settled: its key answers it again and nothing runs.
    requests_before = len(model.requests(conv))
    repeated = new.admit(conv, "one", idempotencyKey="turn-1")
    assert repeated["submissionId"] == done["submissionId"]
    assert repeated["offset"] == done["offset"]
    assert new.history(conv) == history

    # A new turn runs on the whole earlier transcript, the lost call answered as not run.
    third = new.admit(conv, "three")
    assert third["offset"] == len(history)
    assert new.wait_settled(conv, third["submissionId"], third["offset"])["text"] == (
        "after the restore"
    )
    assert len(model.requests(conv)) == requests_before + 1
    messages = model.requests(conv)[-1]["messages"]
    texts = [b.get("text") for m in messages for b in m["content"] if b["type"] == "text"]
    said = ("one", "first answer", "two", "queued", "the queued turn", "three")
    assert [t for t in texts if t in said] == list(said)
    results = [b for m in messages for b in m["content"] if b["type"] == "tool_result"]
    assert [r["content"] for r in results] == [DID_NOT_RUN]
    # The new harness's own log reads back: the restored records, then what came after.
    restored_log, _ = read_log(new, conv, 0)
    assert records_of(restored_log)[:after_second] == records_of(first + second)


def test_the_log_wants_the_token_and_a_known_conversation(
    pair: tuple[Harness, Harness], conv: str
) -> None:
    lost, _ = pair
    lost.start()
    unknown = lost.get(f"/agents/agent/{conv}/log")
    assert unknown.status_code == 404 and "no conversation" in unknown.json()["reason"]
    bare = httpx.get(f"{lost.url}/agents/agent/{conv}/log")
    assert bare.status_code == 401
    bare = httpx.put(f"{lost.url}/agents/agent/{conv}/log", content=b"{}\n")
    assert bare.status_code == 401


def _finished_log(harness: Harness, model: Model, conv: str) -> bytes:
    model.script(conv, ["done"])
    admitted = harness.admit(conv)
    harness.wait_settled(conv, admitted["submissionId"])
    body, _ = read_log(harness, conv, 0)
    return body


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "no log records"),
        (b"\n\n", "no log records"),
        (b"garbage\n", "line 1: not JSON"),
        (b'{"k":"zz"}\n', "line 1: unknown record kind 'zz'"),
        (b'{"k":"sub","id":"s1"}\n', "line 1: a sub record needs 'message'"),
        (b'{"k":"ev","e":{"offset":0,"type":"x"}}\n', "line 1: an event needs 'submissionId'"),
        (b'{"k":"ev","e":{"offset":4,"type":"x","submissionId":"s"}}\n', "line 1: event offset 4"),
    ],
)
def test_a_log_that_cannot_be_replayed_is_400_and_restores_nothing(
    harness: Harness, conv: str, body: bytes, reason: str
) -> None:
    response = put_log(harness, conv, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "bad_request"
    assert reason in response.json()["reason"]
    assert harness.get(f"/agents/agent/{conv}/history").status_code == 404


def test_a_bad_line_after_good_ones_is_named_and_the_good_ones_are_not_kept(
    harness: Harness, model: Model, conv: str
) -> None:
    good = _finished_log(harness, model, conv)
    lines = good.count(b"\n")
    target = f"{conv}-copy"
    response = put_log(harness, target, good + b'{"k":"ev","e":[]}\n')
    assert response.status_code == 400
    assert f"line {lines + 1}: an ev record needs 'e'" in response.json()["reason"]
    assert harness.get(f"/agents/agent/{target}/history").status_code == 404
    # The same records alone restore (under another name: the log names no conversation).
    response = put_log(harness, target, good)
    assert response.status_code == 201, response.text
    assert response.json()["interrupted"] == []
    assert harness.history(target) == harness.history(conv)
    # The conversation a restore would replace is refused, its own name included.
    assert put_log(harness, conv, good).status_code == 409


def test_a_log_over_the_cap_is_413_unread(harness: Harness, conv: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", harness.port, timeout=10)
    connection.putrequest("PUT", f"/agents/agent/{conv}/log")
    connection.putheader("Content-Length", str(300 * 1024 * 1024))
    for name, value in harness.headers().items():
        connection.putheader(name, value)
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413
    assert json.loads(response.read())["error"] == "too_large"
    connection.close()
