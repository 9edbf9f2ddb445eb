"""Bounded reads of what a harness (or an archive) answers: every read stops at the operator's
cap (`--max-history-bytes`) and closes the connection, and the operator says so on the Session.

The harness here is a stand-in whose answers never end (tests/_endless_harness.py, a real
HTTP server on loopback): it streams for real, and counts what it sent before the reader hung
up. tests/wire/test_bounded_history.py measures the reading process's memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer

from corral_api.kinds import AdmissionLedger, AgentSpec, SessionSpec
from corral_operator.archive import FileArchive, build_record
from corral_operator.archive.capture import archive_from_harness
from corral_operator.archive.release import archive_before_release
from corral_operator.archive.s3 import S3Archive
from corral_operator.archive.server import build_app
from corral_operator.archive.store import ArchiveTooLarge
from corral_operator.driver import DriverState, SessionDriver
from corral_operator.main import parse_args, settings_from
from corral_operator.planning import reasons as R
from corral_operator.wireclient import AnswerTooLarge, WireClient, WireRequestFailed

from ..._endless_harness import EndlessHarness

pytestmark = pytest.mark.timeout(30)

MiB = 1024 * 1024
CAP = 1 * MiB
# What the stand-in may have sent beyond what the reader took: its own small send buffer and
# the reader's receive buffer (the kernel's, grown on loopback up to a few MiB).
SOCKET_SLACK = 4 * MiB
SESSION = {
    "apiVersion": "corral.dev/v1alpha1",
    "kind": "Session",
    "metadata": {"name": "c1", "namespace": "agents", "uid": "u-1", "generation": 1},
    "spec": {"agentRef": "fixer"},
    "status": {"phase": "Succeeded", "finishedAt": "2026-01-01T00:00:00Z"},
}
LEDGER = AdmissionLedger(
    stream_url="/agents/fixer/c1/updates", offset=0, submission_id="s1", turn=1
)


@pytest.fixture
def endless() -> Iterator[EndlessHarness]:
    harness = EndlessHarness()
    harness.start()
    yield harness
    harness.stop()


def _client(url: str, cap: int = CAP) -> WireClient:
    return WireClient(url, "fixer", token="t", poll_wait=0.01, max_answer_bytes=cap)


def _hung_up(harness: EndlessHarness) -> int:
    assert harness.closed.wait(10), "the reader never closed the connection"
    return harness.sent


async def test_a_history_past_the_cap_stops_the_read_and_closes_the_connection(
    endless: EndlessHarness,
) -> None:
    async with _client(endless.url) as wire:
        with pytest.raises(AnswerTooLarge) as caught:
            await wire.history("c1")
    assert caught.value.limit == CAP and caught.value.what == "history"
    assert "1 MiB" in str(caught.value) and "--max-history-bytes" in str(caught.value)
    assert "operator.maxHistoryBytes" in str(caught.value)
    sent = _hung_up(endless)
    assert CAP < sent < CAP + SOCKET_SLACK, sent
    assert endless.requests == ["GET /agents/fixer/c1/history HTTP/1.1"]


async def test_a_declared_length_past_the_cap_is_refused_before_its_body_is_read() -> None:
    harness = EndlessHarness(declared_length=50 * 1024**3)
    harness.start()
    try:
        async with _client(harness.url) as wire:
            with pytest.raises(AnswerTooLarge):
                await wire.history("c1")
        assert _hung_up(harness) < SOCKET_SLACK  # nothing of it was read on purpose
    finally:
        harness.stop()


async def test_a_refusal_is_read_to_its_first_64_kib_and_clipped() -> None:
    harness = EndlessHarness(status=400)
    harness.start()
    try:
        async with _client(harness.url, cap=64 * MiB) as wire:
            with pytest.raises(WireRequestFailed) as caught:
                await wire.history("c1")
        assert caught.value.status_code == 400 and len(caught.value.reason) <= 500
        assert _hung_up(harness) < SOCKET_SLACK  # far below the 64 MiB cap of a success
    finally:
        harness.stop()


async def test_an_encoded_answer_is_refused_unread() -> None:
    harness = EndlessHarness(extra_headers=(("Content-Encoding", "gzip"),))
    harness.start()
    try:
        async with _client(harness.url) as wire:
            with pytest.raises(WireRequestFailed, match=r"encoded \(gzip\)"):
                await wire.history("c1")
        assert _hung_up(harness) < SOCKET_SLACK
    finally:
        harness.stop()


async def test_wait_gives_up_on_an_updates_page_past_the_cap_instead_of_polling_again(
    endless: EndlessHarness,
) -> None:
    async with _client(endless.url) as wire:
        with pytest.raises(AnswerTooLarge) as caught:
            await wire.wait("c1", LEDGER)
    assert caught.value.what == "updates"
    _hung_up(endless)
    assert len(endless.requests) == 1 and endless.requests[0].startswith(
        "GET /agents/fixer/c1/updates?offset=0"
    )


async def test_an_answer_within_the_cap_is_read_whole() -> None:
    page = {"events": [{"offset": i, "type": "text", "text": "y" * 1000} for i in range(50)],
            "offset": 50}  # fmt: skip
    body = json.dumps(page).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body)

    wire = WireClient(
        "http://harness.invalid",
        "fixer",
        transport=httpx.MockTransport(handler),
        max_answer_bytes=len(body),
    )
    async with wire:
        assert (await wire.history("c1")).offset == 50
    small = WireClient(
        "http://harness.invalid",
        "fixer",
        transport=httpx.MockTransport(handler),
        max_answer_bytes=len(body) - 1,
    )
    async with small:
        with pytest.raises(AnswerTooLarge):
            await small.history("c1")


class _MemoryStore:
    def __init__(self) -> None:
        self.state = DriverState()

    async def load(self) -> DriverState:
        return self.state.model_copy(deep=True)

    async def save(self, state: DriverState) -> None:
        self.state = state.model_copy(deep=True)


async def test_a_turn_whose_updates_cannot_be_read_ends_failed_naming_the_cap(
    endless: EndlessHarness,
) -> None:
    """Admission is answered by a small server; its updates by the endless stand-in."""
    ended: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/agents/fixer/c1":
            return httpx.Response(
                200, json={"streamUrl": "/agents/fixer/c1/updates", "offset": 0,
                           "submissionId": "s1"},
            )  # fmt: skip
        if request.url.path.endswith("/end"):
            ended.append(request.url.path)
            return httpx.Response(200, json={"ended": True})
        return httpx.Response(404, json={"error": "not_found", "reason": request.url.path})

    class SplitTransport(httpx.AsyncBaseTransport):
        """Updates from the endless stand-in, the rest from `handler`."""

        def __init__(self) -> None:
            self.small = httpx.MockTransport(handler)
            self.endless = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/updates"):
                port = int(endless.url.rsplit(":", 1)[1])
                request.url = request.url.copy_with(scheme="http", host="127.0.0.1", port=port)
                return await self.endless.handle_async_request(request)
            return await self.small.handle_async_request(request)

    store = _MemoryStore()
    spec = SessionSpec.model_validate(
        {"agentRef": "fixer", "task": "Do it.", "workspace": {"repo": "r"}}
    )
    agent = AgentSpec.model_validate({"identity": "x", "model": "claude-haiku-4-5"})
    wire = WireClient(
        "http://harness.invalid", "fixer", transport=SplitTransport(), max_answer_bytes=CAP
    )
    async with wire:
        outcome = await SessionDriver(wire, store, agent, spec, "c1").run()
    assert outcome.phase == "Failed"
    assert outcome.message.startswith("the turn cannot be followed: the harness's updates answer")
    assert "1 MiB" in outcome.message and "--max-history-bytes" in outcome.message
    assert store.state.phase == "Failed" and store.state.ledger is None
    assert ended == ["/agents/fixer/c1/end"]  # the session is ended as any other
    _hung_up(endless)


class _Pods:
    """The pod lookup archive_before_release makes (a stand-in for the API client)."""

    def __init__(self, ip: str) -> None:
        self.ip = ip

    async def get(self, path: str) -> dict[str, Any]:
        return {"metadata": {"name": path.rpartition("/")[2]}, "status": {"podIP": self.ip}}


async def test_a_history_past_the_cap_is_archived_as_its_record_alone_and_said_so(
    endless: EndlessHarness, tmp_path: Path
) -> None:
    store = FileArchive(tmp_path)
    port = int(endless.url.rsplit(":", 1)[1])

    async def token() -> str:
        return "t"

    done = await archive_before_release(
        _Pods("127.0.0.1"),  # type: ignore[arg-type]
        store,
        SESSION,
        SESSION["status"],  # type: ignore[arg-type]
        "/api/v1/namespaces/agents/pods/c1",
        token,
        harness_port=port,
        deadline_seconds=60,
        cause="finished",
        max_history_bytes=CAP,
    )
    # Released at once (a retry would read as much again), with the reason on the condition.
    assert done.release and done.retry_after is None
    assert done.status is not None
    (cond,) = [c for c in done.status["conditions"] if c["type"] == "Archived"]
    assert (cond["status"], cond["reason"]) == ("False", R.HISTORY_TOO_LARGE)
    assert "without the transcript" in cond["message"] and "1 MiB" in cond["message"]
    assert "--max-history-bytes" in cond["message"]
    assert done.event is not None and done.event.reason == R.HISTORY_TOO_LARGE
    assert done.event.type == "Warning"
    archived = store.read("agents", "c1", "u-1")
    assert archived is not None and archived.events == []
    assert archived.record["events"] == 0 and "1 MiB" in archived.record["historyOmitted"]
    assert archived.record["session"]["status"]["phase"] == "Succeeded"
    _hung_up(endless)


async def test_a_history_within_the_cap_is_archived_whole(tmp_path: Path) -> None:
    events = [{"offset": i, "type": "text", "text": "z" * 100} for i in range(20)]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"events": events, "offset": 20})

    store = FileArchive(tmp_path)
    captured = await archive_from_harness(
        store, SESSION, "http://harness.invalid", "t", cause="finished",
        transport=httpx.MockTransport(handler), max_history_bytes=CAP,
    )  # fmt: skip
    assert (captured.events, captured.omitted) == (20, None)
    archived = store.read("agents", "c1")
    assert archived is not None and archived.events == events
    assert "historyOmitted" not in archived.record


def test_an_archived_file_past_the_cap_is_not_read(tmp_path: Path) -> None:
    record = build_record(SESSION, [], archived_at="2026-01-01T00:00:00Z", cause="x")
    events = [{"offset": i, "type": "text", "text": "w" * 1000} for i in range(200)]
    FileArchive(tmp_path).write("agents", "c1", "u-1", record, events)
    whole = FileArchive(tmp_path, max_bytes=CAP).read("agents", "c1")
    assert whole is not None and len(whole.events) == 200
    small = FileArchive(tmp_path, max_bytes=100_000)
    with pytest.raises(ArchiveTooLarge) as caught:
        small.read("agents", "c1", "u-1")
    assert "transcript of agents/c1/u-1" in str(caught.value)
    assert "100000 bytes" in str(caught.value)
    assert "--max-history-bytes" in str(caught.value)
    with pytest.raises(ArchiveTooLarge):
        small.read("agents", "c1")  # the latest run: the same file, the same cap


def test_an_object_store_answer_past_the_cap_stops_the_read(
    endless: EndlessHarness, tmp_path: Path
) -> None:
    (tmp_path / "accessKeyId").write_text("AKIASTANDIN")
    (tmp_path / "secretAccessKey").write_text("stand-in-secret")
    store = S3Archive(endless.url, "corral-archive", "us-east-1", tmp_path, max_bytes=CAP)
    try:
        with pytest.raises(ArchiveTooLarge, match="record of agents/c1/u-1"):
            store.read("agents", "c1", "u-1")
    finally:
        store.close()
    sent = _hung_up(endless)
    assert CAP < sent < CAP + SOCKET_SLACK, sent


async def test_the_archive_reader_answers_502_naming_the_cap() -> None:
    class Refusing:
        """A reader stand-in whose reads run past the cap (the real ones are above)."""

        async def allowed(self, token: str, namespace: str, name: str) -> None:
            return None

        async def transcript(self, *args: object) -> dict[str, Any]:
            raise AnswerTooLarge("updates", CAP)

        async def record(self, *args: object) -> dict[str, Any]:
            raise ArchiveTooLarge("record of agents/c1/u-1", CAP)

    async with TestClient(TestServer(build_app(Refusing()))) as client:  # type: ignore[arg-type]
        auth = {"Authorization": "Bearer person"}
        live = await client.get("/v1/namespaces/agents/sessions/c1/transcript", headers=auth)
        assert live.status == 502
        body = await live.json()
        assert body["error"] == "history_too_large" and "1 MiB" in body["reason"]
        kept = await client.get("/v1/namespaces/agents/sessions/c1/record", headers=auth)
        assert kept.status == 502 and (await kept.json())["error"] == "archive_too_large"


def test_the_flag_sets_the_cap_and_refuses_a_tiny_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert settings_from(parse_args(["-A"])).max_history_bytes == 64 * MiB
    settings = settings_from(parse_args(["-A", "--max-history-bytes", str(CAP)]))
    assert settings.max_history_bytes == CAP
    for bad in ("1000", "-5", "lots"):
        with pytest.raises(SystemExit):
            parse_args(["-A", "--max-history-bytes", bad])
    assert "--max-history-bytes" in capsys.readouterr().err
