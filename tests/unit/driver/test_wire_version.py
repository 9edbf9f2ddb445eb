"""The wire's version (api/corral_api/wire.py): every answer of the harness names it, and the
operator reads nothing of a harness whose version it cannot drive: another major version, or a
minor more than one behind its own. A harness from before the header is version 1.0."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from corral_api.wire import WIRE_VERSION, WIRE_VERSION_HEADER, wire_version_problem
from corral_harness import server as harness_server
from corral_harness.config import HarnessConfig
from corral_harness.server import create_app
from corral_operator.driver import ConversationLost
from corral_operator.wireclient import WireClient, WireVersionUnsupported


@pytest.mark.parametrize(
    ("given", "drivable"),
    [(WIRE_VERSION, True), (None, True), ("1.0", True), ("1.7", True), ("2.0", False),
     ("0.9", False), ("one", False), ("1", False)],
)  # fmt: skip
def test_which_versions_the_operator_drives(given: str | None, drivable: bool) -> None:
    assert (wire_version_problem(given) is None) == drivable
    assert wire_version_problem("1.0", ours="1.3") is not None  # two minors behind
    assert wire_version_problem("1.2", ours="1.3") is None  # the previous minor


def test_every_answer_of_the_harness_names_the_version(tmp_path: Path) -> None:
    token = tmp_path / "wire-token"
    token.write_text("secret-token\n")
    config = HarnessConfig(state_dir=tmp_path / "state", granted_root=tmp_path, token_file=token)
    with TestClient(create_app(config)) as client:
        answers = [
            client.get("/readyz"),
            client.get("/agents/a/c/updates"),  # no token: refused by the middleware
            client.get("/agents/a/c/history", headers={"authorization": "Bearer secret-token"}),
        ]
    assert [a.status_code for a in answers][1:] == [401, 404]
    for answer in answers:
        assert answer.headers[WIRE_VERSION_HEADER] == WIRE_VERSION


def _wire(version: str | None) -> WireClient:
    def answer(request: httpx.Request) -> httpx.Response:
        headers = {WIRE_VERSION_HEADER: version} if version is not None else {}
        body = {"events": [], "offset": 0}
        return httpx.Response(200, content=json.dumps(body).encode(), headers=headers)

    return WireClient(
        "http://harness", "fixer", token="t", poll_wait=0.01,
        transport=httpx.MockTransport(answer),
    )  # fmt: skip


async def test_the_operator_refuses_to_read_a_harness_of_another_major_version() -> None:
    async with _wire("2.0") as wire:
        with pytest.raises(WireVersionUnsupported, match="another major version is never read"):
            await wire.history("c")
    for readable in (WIRE_VERSION, None):  # the current version, and a harness before it
        async with _wire(readable) as wire:
            assert (await wire.history("c")).offset == 0


@asynccontextmanager
async def _harness_speaking(
    version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[WireClient]:
    """The real harness under uvicorn on a loopback port, naming `version` on its answers (as
    an image of that version would), and the operator's client to it with the pod's token."""
    monkeypatch.setattr(harness_server, "WIRE_VERSION", version)
    token = tmp_path / f"token-{version}"
    token.write_text("secret-token\n")
    config = HarnessConfig(
        state_dir=tmp_path / f"state-{version}", granted_root=tmp_path, token_file=token
    )
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=0,
                                           log_level="warning", lifespan="on"))  # fmt: skip
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not serving.done(), "the harness did not start"
            await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with WireClient(
            f"http://127.0.0.1:{port}", "fixer", token="secret-token", poll_wait=0.01
        ) as wire:
            yield wire
    finally:
        server.should_exit = True
        await serving


async def test_a_real_harness_of_another_major_version_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over real HTTP: the harness answers (here: no such conversation), and the operator reads
    nothing of the answer, naming the version instead; the same harness naming this
    operator's version is read (its answer becomes the driver's ConversationLost)."""
    async with _harness_speaking("2.0", tmp_path, monkeypatch) as wire:
        with pytest.raises(WireVersionUnsupported, match=r"speaks wire version 2\.0"):
            await wire.history("c")
    async with _harness_speaking(WIRE_VERSION, tmp_path, monkeypatch) as wire:
        with pytest.raises(ConversationLost, match="no conversation fixer/c"):
            await wire.history("c")
