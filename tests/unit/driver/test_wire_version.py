"""The wire's version (api/corral_api/wire.py): every answer of the harness names it, and the
operator reads nothing of a harness whose version it cannot drive: another major version, or a
minor more than one behind its own. A harness from before the header is version 1.0."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from corral_api.wire import WIRE_VERSION, WIRE_VERSION_HEADER, wire_version_problem
from corral_harness.config import HarnessConfig
from corral_harness.server import create_app
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
