"""The gateway provider against the stand-in for a Messages-compatible gateway
(corral_dev.providers._gateway), real HTTP on loopback, the scripted model behind it: the key
goes in the gateway's own header with its scheme, never in x-api-key, and the stand-in refuses
anything else; once through the whole custodian as a process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_api.providers import ModelProvider
from corral_common.sse import EventStreamParser
from corral_custodian.providers import ModelRequest
from corral_custodian.providers._messages import MessagesProvider
from corral_dev.providers._gateway import GatewayStandIn, serve_gateway_in_thread
from corral_dev.providers._vertex import RunningApp
from tests._scripted import ScriptedServer

from ._custodian_proc import running_custodian

pytestmark = pytest.mark.timeout(60)

KEY = "gw-key-0123456789abcdef"
MODEL = "claude-haiku-4-5"
REPLY = {"text": "hello through the gateway", "usage": {"input_tokens": 40, "output_tokens": 6}}


@contextmanager
def gateway(upstream: ScriptedServer, **options: Any) -> Iterator[tuple[GatewayStandIn, str]]:
    upstream.load({"default": [REPLY] * 20})
    standin = GatewayStandIn(upstream.url, key=KEY, **options)
    running: RunningApp = serve_gateway_in_thread(standin)
    try:
        yield standin, running.url
    finally:
        running.stop()


def model_request(stream: bool = True) -> ModelRequest:
    body = {
        "model": MODEL,
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
    }
    return ModelRequest(MODEL, body, {"anthropic-version": "2023-06-01"})


def text_of(data: bytes) -> str:
    parser = EventStreamParser()
    found = [json.loads(e.data) for e in parser.feed(data)]
    return "".join(e["delta"].get("text", "") for e in found if e["type"] == "content_block_delta")


async def send(provider: MessagesProvider, request: ModelRequest) -> tuple[int, bytes]:
    async with httpx.AsyncClient() as http:
        got = await provider.send(http, request)
        try:
            data = b"".join([c async for c in got.stream()]) if got.is_stream else await got.read()
        finally:
            await got.aclose()
    return got.status_code, data


@pytest.mark.parametrize(
    ("header", "scheme", "sent"),
    [("authorization", "Bearer", f"Bearer {KEY}"), ("x-gateway-key", None, KEY)],
    ids=["bearer", "own-header"],
)
async def test_the_key_goes_in_the_gateways_header_with_its_scheme(
    scripted: ScriptedServer, header: str, scheme: str | None, sent: str
) -> None:
    with gateway(scripted, auth_header=header, auth_scheme=scheme) as (standin, url):
        spec = ModelProvider(
            name="gw", type="gateway", base_url=url, auth_header=header, auth_scheme=scheme
        )
        provider = MessagesProvider(spec, KEY)
        status, data = await send(provider, model_request())
        assert status == 200 and text_of(data) == "hello through the gateway"
        status, data = await send(provider, model_request(stream=False))
        assert status == 200 and json.loads(data)["usage"]["output_tokens"] == 6
    assert [r["auth"] for r in standin.requests] == [sent, sent]
    assert [r["refused"] for r in standin.requests] == [None, None]
    assert all("x-api-key" not in r["headers"] for r in standin.requests)
    assert [r["body"]["model"] for r in scripted.requests()] == [MODEL, MODEL]


async def test_the_gateway_refuses_a_missing_or_wrong_key_and_x_api_key(
    scripted: ScriptedServer,
) -> None:
    with gateway(scripted) as (standin, url):
        body = model_request().body
        for headers, why in (
            ({}, "no key"),
            ({"authorization": "Bearer not-the-key"}, "invalid key"),
            ({"authorization": f"Basic {KEY}"}, "must be 'Bearer <key>'"),
            ({"authorization": KEY}, "must be 'Bearer <key>'"),
            # The right key, but where this gateway does not take it.
            ({"x-api-key": KEY}, "x-api-key is not accepted"),
            ({"x-api-key": KEY, "authorization": f"Bearer {KEY}"}, "x-api-key is not accepted"),
        ):
            response = httpx.post(url + "/v1/messages", json=body, headers=headers, timeout=10)
            assert response.status_code == 401, response.text
            error = response.json()
            assert error["type"] == "error"
            assert error["error"]["type"] == "authentication_error"
            assert why in error["error"]["message"]
        # Through the provider, with another key: the same refusal, in the Messages API's terms.
        spec = ModelProvider(
            name="gw", type="gateway", base_url=url, auth_header="authorization",
            auth_scheme="Bearer",
        )  # fmt: skip
        status, data = await send(MessagesProvider(spec, "some-other-key-42"), model_request())
        assert status == 401 and json.loads(data)["error"]["type"] == "authentication_error"
    assert len(standin.requests) == 7 and all(r["refused"] for r in standin.requests)
    assert scripted.requests() == []


async def test_the_upstreams_own_key_goes_upstream_and_the_gateways_does_not(
    scripted: ScriptedServer,
) -> None:
    with gateway(scripted, upstream_key="upstream-key-abcdef") as (_, url):
        spec = ModelProvider(
            name="gw", type="gateway", base_url=url, auth_header="authorization",
            auth_scheme="Bearer",
        )  # fmt: skip
        status, _ = await send(MessagesProvider(spec, KEY), model_request())
        assert status == 200
    (received,) = scripted.requests()
    assert received["headers"]["x-api-key"] == "upstream-key-abcdef"
    assert "authorization" not in received["headers"]


@contextmanager
def gateway_process(*args: str) -> Iterator[dict[str, Any]]:
    """`python -m corral_dev.providers gateway ...` as a process; yields its JSON line."""
    process = subprocess.Popen(
        [sys.executable, "-m", "corral_dev.providers", "gateway", *args],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    stdout = process.stdout
    lines: list[str] = []
    # A thread reads, so a stand-in that never prints fails the test instead of hanging it.
    reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
    reader.start()
    try:
        reader.join(timeout=20)
        assert lines and lines[0].strip(), f"no line from the stand-in (exit {process.poll()})"
        yield json.loads(lines[0])
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.parametrize("key_from", ["ANTHROPIC_API_KEY", "CORRAL_MODEL_KEY_FILE"])
def test_the_custodian_sends_the_key_only_in_the_gateways_header(
    scripted: ScriptedServer, tmp_path: Path, key_from: str
) -> None:
    scripted.load({"default": [REPLY] * 20})
    with gateway_process(
        "--upstream", scripted.url, "--key", KEY, "--auth-header", "x-gateway-key",
        "--auth-scheme", "Token",
    ) as line:  # fmt: skip
        assert line == {"url": line["url"], "auth_header": "x-gateway-key", "auth_scheme": "Token"}
        spec = ModelProvider(
            name="llm-gw", type="gateway", base_url=line["url"], auth_header="x-gateway-key",
            auth_scheme="Token",
        )  # fmt: skip
        env = {
            "CORRAL_MODEL_PROVIDER": spec.to_json(),
            "CORRAL_AGENT_SPEC_JSON": json.dumps({"identity": "x", "model": MODEL}),
        }
        if key_from == "ANTHROPIC_API_KEY":
            env["ANTHROPIC_API_KEY"] = KEY
        else:
            key_file = tmp_path / "model-key"
            key_file.write_text(KEY + "\n")
            env["CORRAL_MODEL_KEY_FILE"] = str(key_file)
        with running_custodian(env, tmp_path / "custodian.log") as custodian:
            body = {
                "model": MODEL, "max_tokens": 100, "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            }  # fmt: skip
            # The harness's own headers (its credential, an x-api-key it might send) stay here.
            headers = {**custodian.headers, "x-api-key": "harness-side-placeholder"}
            sent = httpx.post(
                custodian.url + "/v1/messages", json=body, headers=headers, timeout=30
            )
            assert sent.status_code == 200, sent.text
            assert text_of(sent.content) == "hello through the gateway"
            usage: Any = custodian.usage()
            assert (usage["usage"]["input"], usage["usage"]["output"]) == (40, 6)
        received = httpx.get(line["url"] + "/_standin/requests", timeout=10).json()
    assert len(received) == 1
    assert received[0]["auth"] == f"Token {KEY}" and received[0]["refused"] is None
    assert not {"x-api-key", "authorization"} & set(received[0]["headers"])
    assert KEY not in (tmp_path / "custodian.log").read_text()
