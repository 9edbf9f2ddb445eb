"""The lean engine's two transports: the small HTTP/1.1 client for a plain-HTTP endpoint (the
custodian in the pod), httpx where TLS, a proxy or credentials in the URL may be met.

The whole adapter conformance suite (test_engine_adapter.py) runs here once more with the lean
engine held to httpx, so both of its transports pass the same tests."""

from __future__ import annotations

import asyncio

import pytest

from corral_harness.engine import lean_engine
from corral_harness.engine._loop import EngineSettings, StreamingEngine
from corral_harness.engine.lean_engine import LeanEngine, _direct_client

from . import test_engine_adapter as conformance

pytestmark = pytest.mark.timeout(30)


class LeanOverHttpx(LeanEngine):
    direct = False


@pytest.fixture
def adapter() -> type[StreamingEngine]:
    return LeanOverHttpx


# The conformance tests, over httpx (the `adapter` fixture above).
globals().update({k: v for k, v in vars(conformance).items() if k.startswith("test_")})


async def test_a_plain_http_endpoint_goes_direct_and_others_through_httpx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    direct = _direct_client(EngineSettings(base_url="http://127.0.0.1:8080/prefix/"))
    assert direct is not None and direct[0].host == "127.0.0.1:8080" and direct[1] == "/prefix"
    again = _direct_client(EngineSettings(base_url="http://127.0.0.1:8080/prefix"))
    assert again is not None and again[0] is direct[0]  # one client, its connections kept
    for through_httpx in (
        "https://api.anthropic.com",
        "http://user:secret@127.0.0.1:8080",
        "http://127.0.0.1:8080?x=1",
    ):
        assert _direct_client(EngineSettings(base_url=through_httpx)) is None, through_httpx
    assert _direct_client(EngineSettings()) is None  # the default endpoint is https
    # A proxy in the environment is httpx's to honour, unless NO_PROXY exempts the host.
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert _direct_client(EngineSettings(base_url="http://10.0.0.7:8080")) is None
    monkeypatch.setenv("NO_PROXY", "10.0.0.7")
    assert _direct_client(EngineSettings(base_url="http://10.0.0.7:8080")) is not None


async def test_a_closed_loops_client_is_not_reused_by_a_loop_with_its_id() -> None:
    settings = EngineSettings(base_url="http://127.0.0.1:9")
    first = _direct_client(settings)
    key = (id(asyncio.get_running_loop()), "http://127.0.0.1:9")
    stale = lean_engine._direct[key]
    lean_engine._direct[key] = (lambda: None, stale[1], stale[2])  # type: ignore[assignment]
    again = _direct_client(settings)
    assert first is not None and again is not None and again[0] is not first[0]
