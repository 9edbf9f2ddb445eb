"""Durability across a kill -9, the bearer token, read-only sessions and POST /checks."""

from __future__ import annotations

import httpx
import pytest

from corral_harness.engine.seam import DID_NOT_RUN

from ._rig import Harness, Model

pytestmark = pytest.mark.timeout(90)


def test_kill_9_mid_turn_keeps_history_and_fails_the_submission_in_flight(
    fresh_harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            "first answer",
            {
                "tool_uses": [
                    {"name": "bash", "input": {"command": "sleep 30"}},
                    {"name": "bash", "input": {"command": "touch later"}},
                ]
            },
            "after the restart",
        ],
    )
    harness = fresh_harness
    harness.start()
    done = harness.admit(conv, "one")
    harness.wait_settled(conv, done["submissionId"])
    in_flight = harness.admit(conv, "two")
    queued = harness.admit(conv, "three")
    harness.wait_for(conv, "tool_start")
    before = harness.history(conv)
    harness.kill9()

    harness.start()
    after = harness.history(conv)
    assert after[: len(before)] == before  # the record survived, offsets and all
    settled = {e["submissionId"]: e for e in after if e["type"] == "settled"}
    assert settled[done["submissionId"]]["status"] == "completed"
    failed = settled[in_flight["submissionId"]]
    assert failed["status"] == "failed"
    assert failed["error"]["type"] == "harness_restarted"
    # The queued submission was accepted before the crash; it runs after the restart.
    third = harness.wait_settled(conv, queued["submissionId"])
    assert third["status"] == "completed" and third["text"] == "after the restart"
    assert not (harness.root / "later").exists()
    # The model saw the interrupted calls answered, not orphaned.
    last = model.requests(conv)[-1]["messages"]
    results = [b for m in last for b in m["content"] if b["type"] == "tool_result"]
    assert [r["content"] for r in results] == [DID_NOT_RUN, DID_NOT_RUN]
    assert last[0]["content"][0]["text"] == "one"
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]


def test_a_torn_log_tail_is_cut_so_later_boots_keep_everything(
    fresh_harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, ["kept", "after the tear", "after the second boot"])
    harness = fresh_harness
    harness.start()
    harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    harness.stop()
    log = harness.state_dir / "conversations" / "agent" / conv / "log.jsonl"
    with log.open("a") as fh:
        fh.write('{"k":"ev","e":{"offset":')  # a crash in the middle of a write
    harness.start()
    assert [e["type"] for e in harness.history(conv)][-1] == "settled"
    assert log.read_bytes().endswith(b"\n")  # the tear is gone from the file
    second = harness.admit(conv, "two")["submissionId"]
    assert harness.wait_settled(conv, second)["text"] == "after the tear"
    harness.stop()

    # Without the cut, this boot would stop reading at the tear and lose turn two.
    harness.start()
    settled = [e for e in harness.history(conv) if e["type"] == "settled"]
    assert [e["text"] for e in settled] == ["kept", "after the tear"]
    third = harness.admit(conv, "three")["submissionId"]
    assert harness.wait_settled(conv, third)["text"] == "after the second boot"


def test_repeating_an_admission_key_returns_the_same_submission_across_restarts(
    fresh_harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, ["only once"])
    harness = fresh_harness
    harness.start()
    body = {"message": "hello", "idempotencyKey": "turn-1"}
    first = harness.post(f"/agents/agent/{conv}", body).json()
    again = harness.post(f"/agents/agent/{conv}", body).json()
    assert again == first
    harness.wait_settled(conv, first["submissionId"])
    harness.stop()
    harness.start()
    after_restart = harness.post(f"/agents/agent/{conv}", body).json()
    assert after_restart == first
    subs = {e["submissionId"] for e in harness.history(conv)}
    assert subs == {first["submissionId"]}
    assert len(model.requests(conv)) == 1  # the turn ran once


def test_the_wire_wants_the_bearer_token(fresh_harness: Harness, model: Model, conv: str) -> None:
    token_file = fresh_harness.state_dir.parent / "token"
    token_file.write_text("s3cret-token\n")
    fresh_harness.extra_env["CORRAL_WIRE_TOKEN_FILE"] = str(token_file)
    fresh_harness.start()
    url = fresh_harness.url
    assert httpx.get(f"{url}/readyz").status_code == 200
    body = {"message": "x", "agent": {"identity": "i", "model": "corral-scripted"}}
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "s3cret-token"},
        {"Authorization": "Bearer s3cret-tokenX"},
    ):
        response = httpx.post(f"{url}/agents/a/{conv}", json=body, headers=headers)
        assert response.status_code == 401
        assert response.json()["reason"] == "a valid bearer token is required"
        for path in (f"/agents/a/{conv}/history", "/metrics"):
            assert httpx.get(f"{url}{path}", headers=headers).status_code == 401
        assert (
            httpx.post(f"{url}/checks", json={"command": "true"}, headers=headers).status_code
            == 401
        )
    assert httpx.get(f"{url}/agents/a/{conv}/history").status_code == 401
    fresh_harness.token = "s3cret-token"
    model.script(conv, ["authorised"])
    admitted = fresh_harness.admit(conv, agent="a")
    assert (
        fresh_harness.wait_settled(conv, admitted["submissionId"], agent="a")["text"]
        == "authorised"
    )
    # A command the model runs learns no control endpoint: no CORRAL_* variable at all.
    model.script(conv, [{"tool_use": {"name": "bash", "input": {"command": "env"}}}, "ok"])
    fresh_harness.wait_settled(
        conv, fresh_harness.admit(conv, agent="a")["submissionId"], agent="a"
    )
    env_output = model.requests(conv)[-1]["messages"][-1]["content"][0]["content"]
    assert "CORRAL_" not in env_output and "PATH=" in env_output


def test_a_read_only_session_refuses_writes_and_commands(
    fresh_harness: Harness, model: Model, conv: str
) -> None:
    fresh_harness.extra_env["CORRAL_READ_ONLY"] = "1"
    fresh_harness.start()
    (fresh_harness.root / "a.txt").write_text("original\n")
    model.script(
        conv,
        [
            {
                "tool_uses": [
                    {"name": "bash", "input": {"command": "touch made-by-bash"}},
                    {"name": "write", "input": {"path": "a.txt", "content": "changed"}},
                    {
                        "name": "edit",
                        "input": {
                            "path": "a.txt",
                            "old_string": "original",
                            "new_string": "changed",
                        },
                    },
                    {"name": "read", "input": {"path": "a.txt"}},
                ]
            },
            "ok",
        ],
    )
    fresh_harness.wait_settled(conv, fresh_harness.admit(conv)["submissionId"])
    # Writers are not even offered to a read-only session, and a call of one is refused.
    offered = {tool["name"] for tool in model.requests(conv)[0].get("tools", [])}
    assert "read" in offered and not {"bash", "write", "edit"} & offered
    results = model.requests(conv)[1]["messages"][-1]["content"]
    for result in results[:3]:
        assert result["is_error"] is True
    assert "original" in results[3]["content"] and "is_error" not in results[3]
    assert (fresh_harness.root / "a.txt").read_text() == "original\n"
    assert not (fresh_harness.root / "made-by-bash").exists()


def test_checks_run_in_the_granted_root(harness: Harness) -> None:
    (harness.root / "marker.txt").write_text("present")
    response = harness.post("/checks", {"command": "cat marker.txt; echo; pwd; exit 3"})
    assert response.status_code == 200
    body = response.json()
    assert body["exitCode"] == 3 and body["timedOut"] is False
    assert body["output"] == f"present\n{harness.root.resolve()}\n"
    long = harness.post("/checks", {"command": "yes 0123456789 | head -c 20000"}).json()
    assert len(long["output"]) == 4000 and long["exitCode"] == 0
    slow = harness.post("/checks", {"command": "sleep 30", "timeoutSeconds": 1}).json()
    assert slow["timedOut"] is True and slow["exitCode"] != 0
    for bad in ({}, {"command": ""}, {"command": "true", "timeoutSeconds": 0}, {"cmd": "x"}):
        response = harness.post("/checks", bad)
        assert response.status_code == 400 and response.json()["reason"]


def test_a_graceful_stop_settles_the_submission_in_flight_failed(
    fresh_harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, [{"tool_use": {"name": "bash", "input": {"command": "sleep 30"}}}])
    harness = fresh_harness
    harness.start()
    admitted = harness.admit(conv)
    harness.wait_for(conv, "tool_start")
    harness.stop()  # SIGTERM: uvicorn shuts down and the turn is cancelled
    harness.start()
    settled = harness.wait_settled(conv, admitted["submissionId"])
    assert settled["status"] == "failed"
    assert settled["error"]["type"] == "harness_stopped"
    assert [e["type"] for e in harness.history(conv)].count("settled") == 1
