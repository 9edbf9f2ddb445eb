"""The Google Vertex AI provider against the stand-in for Google's token endpoint and Vertex AI
(corral_dev.providers._vertex), real HTTP on loopback, the scripted model behind it: the JWT
grant the stand-in verifies with google-auth, the token's cache and renewal, the routes, the
body, the errors in the Messages API's terms, and once the whole custodian as a process.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from corral_api.providers import ModelProvider
from corral_common.sse import EventStreamParser
from corral_custodian import _secrets
from corral_custodian.budget import StreamUsageReader
from corral_custodian.providers import ModelRequest, ProviderRefusal, UpstreamAnswer
from corral_custodian.providers._vertex import VertexProvider, translated_error
from corral_dev.ports import free_port
from corral_dev.providers._vertex import (
    KEY_TOKEN_URI,
    RunningApp,
    StandInServiceAccount,
    VertexStandIn,
    make_service_account,
    serve_in_thread,
    serve_vertex_in_thread,
)
from tests._scripted import ScriptedServer

from ._custodian_proc import running_custodian

pytestmark = pytest.mark.timeout(60)

PROJECT = "corral-test-proj"
REGION = "us-east5"
MODEL = "claude-haiku-4-5"
VERTEX_ID = "claude-haiku-4-5@20251001"
REPLY = {"text": "hello from vertex", "usage": {"input_tokens": 120, "output_tokens": 7}}
SCRIPT = {"default": [REPLY] * 60}


@dataclass
class Rig:
    """The stand-in served on loopback before the scripted model, and its provider entry."""

    standin: VertexStandIn
    running: RunningApp
    account: StandInServiceAccount
    upstream: ScriptedServer

    @property
    def spec(self) -> ModelProvider:
        return ModelProvider(
            name="vertex-test", type="vertex", project=PROJECT, region=REGION,
            endpoint_url=self.running.url, token_url=self.standin.token_url,
        )  # fmt: skip

    def provider(self, key_json: str | None = None) -> VertexProvider:
        return VertexProvider(self.spec, key_json=key_json or self.account.json())

    def received(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.standin.requests if r["kind"] == kind]


@pytest.fixture
def rig(scripted: ScriptedServer) -> Iterator[Rig]:
    scripted.load(SCRIPT)
    account = make_service_account(PROJECT)
    standin = VertexStandIn(scripted.url, account=account, project=PROJECT, region=REGION)
    running = serve_vertex_in_thread(standin)
    try:
        yield Rig(standin, running, account, scripted)
    finally:
        running.stop()


def model_request(model: str = MODEL, *, stream: bool = True, beta: str = "") -> ModelRequest:
    body = {
        "model": model,
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "vertex"},
        "stream": stream,
    }
    headers = {"anthropic-version": "2023-06-01"}
    if beta:
        headers["anthropic-beta"] = beta
    return ModelRequest(model, body, headers)


async def answer(
    provider: VertexProvider, http: httpx.AsyncClient, request: ModelRequest | None = None
) -> tuple[UpstreamAnswer, bytes]:
    got = await provider.send(http, request or model_request())
    try:
        data = b"".join([c async for c in got.stream()]) if got.is_stream else await got.read()
    finally:
        await got.aclose()
    return got, data


def events(data: bytes) -> list[dict[str, Any]]:
    parser = EventStreamParser()
    found = parser.feed(data)
    parser.close()
    return [json.loads(e.data) for e in found]


def text_of(data: bytes) -> str:
    return "".join(
        e["delta"].get("text", "") for e in events(data) if e["type"] == "content_block_delta"
    )


def error_of(got: UpstreamAnswer, data: bytes) -> tuple[int, str, str, str]:
    body = json.loads(data)
    assert body["type"] == "error", body
    assert got.headers["content-type"] == "application/json"
    retry = got.headers["x-should-retry"]
    return got.status_code, body["error"]["type"], body["error"]["message"], retry


# --------------------------------------------------------------------------- the happy paths


async def test_a_streamed_request_goes_by_streamRawPredict_and_its_answer_passes_through(
    rig: Rig,
) -> None:
    provider = rig.provider()
    async with httpx.AsyncClient() as http:
        request = model_request(beta="interleaved-thinking-2025-05-14")
        got, data = await answer(provider, http, request)
        assert (got.status_code, got.is_stream) == (200, True)
        assert text_of(data) == "hello from vertex"
        reader = StreamUsageReader(MODEL)
        reader.feed(data)
        reader.close()
        assert (reader.usage.input, reader.usage.output, reader.completed) == (120, 7, True)

        unstreamed, whole = await answer(provider, http, model_request(stream=False))
        assert (unstreamed.status_code, unstreamed.is_stream) == (200, False)
        assert json.loads(whole)["content"] == [{"type": "text", "text": "hello from vertex"}]

    streamed, plain = rig.received("predict")
    base = f"/v1/projects/{PROJECT}/locations/{REGION}/publishers/anthropic/models/{VERTEX_ID}"
    assert streamed["path"] == base + ":streamRawPredict"
    assert plain["path"] == base + ":rawPredict"
    # The URL names the model; the body carries Vertex's version and no model.
    assert streamed["body"] == {
        "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "vertex"}, "stream": True,
        "anthropic_version": "vertex-2023-10-16",
    }  # fmt: skip
    headers = streamed["headers"]
    assert headers["authorization"].startswith("Bearer ya29.standin-")
    assert headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert "anthropic-version" not in headers and "x-api-key" not in headers
    assert headers["accept-encoding"] == "identity"
    # Behind Vertex, the Messages API got its own name for the model.
    assert [r["body"]["model"] for r in rig.upstream.requests()] == [MODEL, MODEL]


async def test_the_sse_is_relayed_byte_for_byte(scripted: ScriptedServer) -> None:
    # An upstream whose stream is fixed bytes (a comment, a ping, CRLF line ends, pieces that
    # split events), so what comes out can be compared with what went in.
    pieces = [
        b': keep-alive\r\n\r\nevent: message_start\r\ndata: {"type": "message_start", ',
        b'"message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", '
        b'"content": [], "usage": {"input_tokens": 3, "output_tokens": 1}}}\r\n\r\n',
        b'event: ping\r\ndata: {"type": "ping"}\r\n\r\n',
        b'event: message_delta\r\ndata: {"type": "message_delta", "delta": {"stop_reason": '
        b'"end_turn"}, "usage": {"output_tokens": 2}}\r\n\r\nevent: message_stop\r\n'
        b'data: {"type": "message_stop"}\r\n\r\n',
    ]

    async def stream(request: Request) -> Response:
        async def body() -> Any:
            for piece in pieces:
                yield piece
                await asyncio.sleep(0.01)

        return StreamingResponse(body(), media_type="text/event-stream")

    fixed = serve_in_thread(
        Starlette(routes=[Route("/v1/messages", stream, methods=["POST"])]), name="fixed-sse"
    )
    account = make_service_account(PROJECT)
    standin = VertexStandIn(fixed.url, account=account, project=PROJECT, region=REGION)
    running = serve_vertex_in_thread(standin)
    try:
        rig = Rig(standin, running, account, scripted)
        async with httpx.AsyncClient() as http:
            got, data = await answer(rig.provider(), http)
        assert got.is_stream and data == b"".join(pieces)
    finally:
        running.stop()
        fixed.stop()


# --------------------------------------------------------------------------- the JWT grant


def forged(account: StandInServiceAccount, **changes: str) -> str:
    """A key that claims `account`'s name and key id but signs with another private key."""
    other = make_service_account(PROJECT)
    return json.dumps({**account.key, "private_key": other.key["private_key"], **changes}, indent=1)


async def test_the_grant_is_verified_and_a_key_the_endpoint_does_not_know_is_refused(
    rig: Rig,
) -> None:
    async with httpx.AsyncClient() as http:
        for key_json, why in (
            (forged(rig.account), "Invalid JWT Signature"),
            (forged(rig.account, client_email="someone@else.iam.gserviceaccount.com"),
             "Invalid JWT Signature"),
            (make_service_account(PROJECT).json(), "Invalid JWT Signature"),
        ):  # fmt: skip
            with pytest.raises(ProviderRefusal) as refused:
                await rig.provider(key_json).send(http, model_request())
            assert (refused.value.status, refused.value.kind) == (401, "authentication_error")
            assert refused.value.message.startswith("Google token endpoint: invalid_grant: ")
            assert why in refused.value.message
            assert not refused.value.retry
    assert len(rig.received("token")) == 3
    assert rig.received("predict") == [] and rig.standin.issued == []


async def test_the_keys_own_token_uri_is_never_used(rig: Rig, scripted: ScriptedServer) -> None:
    # A live token endpoint named by the key's token_uri: it must hear nothing.
    decoy = VertexStandIn(scripted.url, account=rig.account, project=PROJECT, region=REGION)
    decoy_running = serve_vertex_in_thread(decoy)
    try:
        assert rig.account.key["token_uri"] == KEY_TOKEN_URI  # the generated file's
        key = json.dumps({**rig.account.key, "token_uri": decoy.token_url})
        async with httpx.AsyncClient() as http:
            got, _ = await answer(rig.provider(key), http)
        assert got.status_code == 200
        assert decoy.requests == [] and len(rig.received("token")) == 1
    finally:
        decoy_running.stop()


# --------------------------------------------------------------------------- the token's life


async def test_the_token_is_minted_once_and_shared(rig: Rig) -> None:
    provider = rig.provider()
    async with httpx.AsyncClient() as http:
        # Requests in flight together wait for one mint.
        results = await asyncio.gather(*(answer(provider, http) for _ in range(5)))
        assert [got.status_code for got, _ in results] == [200] * 5
        for _ in range(3):
            assert (await answer(provider, http))[0].status_code == 200
    assert len(rig.received("token")) == 1 and len(rig.standin.issued) == 1
    tokens = {r["headers"]["authorization"] for r in rig.received("predict")}
    assert tokens == {f"Bearer {rig.standin.issued[0]}"}


async def test_a_token_is_minted_again_before_it_expires(rig: Rig) -> None:
    # 302 s: fresh for the 2 s before the five-minute margin.
    rig.standin.expires_in = 302
    provider = rig.provider()
    async with httpx.AsyncClient() as http:
        assert (await answer(provider, http))[0].status_code == 200
        assert (await answer(provider, http))[0].status_code == 200
        assert len(rig.standin.issued) == 1
        await asyncio.sleep(2.2)
        assert (await answer(provider, http))[0].status_code == 200
    assert len(rig.standin.issued) == 2
    last = rig.received("predict")[-1]["headers"]["authorization"]
    assert last == f"Bearer {rig.standin.issued[1]}"


async def test_a_token_vertex_refuses_is_dropped_and_the_next_request_mints_anew(
    rig: Rig,
) -> None:
    provider = rig.provider()
    async with httpx.AsyncClient() as http:
        assert (await answer(provider, http))[0].status_code == 200
        httpx.post(rig.running.url + "/_standin/revoke", timeout=10).raise_for_status()
        got, data = await answer(provider, http)
        status, kind, message, retry = error_of(got, data)
        assert (status, kind, retry) == (401, "authentication_error", "false")
        assert message.startswith("Google Vertex AI: Request had invalid authentication")
        assert (await answer(provider, http))[0].status_code == 200
    assert len(rig.standin.issued) == 2


async def test_minted_tokens_are_registered_with_the_redactor(rig: Rig) -> None:
    async with httpx.AsyncClient() as http:
        await answer(rig.provider(), http)
        issued = (await http.get(rig.running.url + "/_standin/issued")).json()["tokens"]
    assert len(issued) == 1
    redacted = _secrets.redact(f"the header was 'Bearer {issued[0]}', quoted {issued[0]!r}")
    assert issued[0] not in redacted and "[redacted:" in redacted


# --------------------------------------------------------------------------- errors


GOOGLE_CASES = [
    ("RESOURCE_EXHAUSTED", "google", 429, "rate_limit_error", "true"),
    ("RESOURCE_EXHAUSTED", "google-list", 429, "rate_limit_error", "true"),
    ("PERMISSION_DENIED", "google", 403, "permission_error", "false"),
    ("NOT_FOUND", "google", 404, "not_found_error", "false"),
    ("UNAUTHENTICATED", "google", 401, "authentication_error", "false"),
    ("INVALID_ARGUMENT", "google", 400, "invalid_request_error", "false"),
    ("FAILED_PRECONDITION", "google-list", 400, "invalid_request_error", "false"),
    ("UNAVAILABLE", "google", 503, "overloaded_error", "true"),
    ("DEADLINE_EXCEEDED", "google", 504, "api_error", "false"),
    ("INTERNAL", "google", 500, "api_error", "true"),
]


async def test_googles_errors_become_the_messages_apis_with_googles_message(rig: Rig) -> None:
    provider = rig.provider()
    async with httpx.AsyncClient() as http:
        for google, shape, status, kind, retry in GOOGLE_CASES:
            message = f"the model said {google.lower()}"
            rig.standin.fail_next(status=google, shape=shape, message=message, retry_after="7")
            got, data = await answer(provider, http)
            assert error_of(got, data) == (status, kind, f"Google Vertex AI: {message}", retry)
            assert got.headers["retry-after"] == "7"
            assert not got.is_stream
        # The model's own error, which Vertex passes through, stays as it is.
        rig.standin.fail_next(shape="anthropic", code=529, type="overloaded_error",
                              message="Overloaded")  # fmt: skip
        got, data = await answer(provider, http)
        assert json.loads(data) == {
            "type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}
        }  # fmt: skip
        assert (got.status_code, got.headers["x-should-retry"]) == (529, "true")
        assert (await answer(provider, http))[0].status_code == 200
    # Only the UNAUTHENTICATED answer (a 401) dropped the token: one more was minted after it.
    assert len(rig.standin.issued) == 2
    authorizations = [r["headers"]["authorization"] for r in rig.received("predict")]
    first, second = (f"Bearer {t}" for t in rig.standin.issued)
    assert authorizations == [first] * 5 + [second] * 7


async def test_a_model_vertex_does_not_serve_is_not_found(scripted: ScriptedServer) -> None:
    account = make_service_account(PROJECT)
    standin = VertexStandIn(
        scripted.url, account=account, project=PROJECT, region=REGION,
        model_map={"claude-opus-4-6": "claude-opus-4-6"},
    )  # fmt: skip
    running = serve_vertex_in_thread(standin)
    try:
        async with httpx.AsyncClient() as http:
            got, data = await answer(Rig(standin, running, account, scripted).provider(), http)
        status, kind, message, retry = error_of(got, data)
        assert (status, kind, retry) == (404, "not_found_error", "false")
        assert message.startswith("Google Vertex AI: Publisher Model `projects/")
        assert VERTEX_ID in message
    finally:
        running.stop()


def test_an_answer_in_no_known_shape_keeps_its_status_and_says_what_it_was() -> None:
    html = b"<html><body>502 Bad Gateway</body></html>"
    got = translated_error(502, httpx.Headers({"content-type": "text/html"}), html)
    body = json.loads(asyncio.run(got.read()))
    assert got.status_code == 502 and got.headers["x-should-retry"] == "true"
    assert body["error"]["type"] == "api_error"
    assert body["error"]["message"].startswith("Google Vertex AI: HTTP 502: <html>")


async def test_the_token_endpoints_refusals(rig: Rig) -> None:
    provider = rig.provider()
    cases = [
        ({"status": "invalid_grant", "code": 400, "message": "Invalid JWT Signature."},
         401, "authentication_error", False,
         "Google token endpoint: invalid_grant: Invalid JWT Signature."),
        ({"status": "rate_limit_exceeded", "code": 429, "message": "slow down"},
         503, "overloaded_error", True, "Google token endpoint: rate_limit_exceeded: slow down"),
        ({"status": "internal_failure", "code": 503, "message": "try later"},
         503, "overloaded_error", True, "Google token endpoint: internal_failure: try later"),
    ]  # fmt: skip
    async with httpx.AsyncClient() as http:
        for fault, status, kind, retry, message in cases:
            httpx.post(
                rig.running.url + "/_standin/fail", json={"on": "token", **fault}, timeout=10
            ).raise_for_status()
            with pytest.raises(ProviderRefusal) as refused:
                await provider.send(http, model_request())
            got = refused.value
            assert (got.status, got.kind, got.retry, got.message) == (status, kind, retry, message)
        # No token was cached from a refusal: the next request mints and passes.
        assert (await answer(provider, http))[0].status_code == 200
    assert rig.received("predict")[0]["headers"]["authorization"].startswith("Bearer ")
    assert len(rig.received("token")) == 4


async def test_an_unreachable_token_endpoint_is_an_http_error(rig: Rig) -> None:
    spec = rig.spec.model_copy(update={"token_url": f"http://127.0.0.1:{free_port()}/token"})
    provider = VertexProvider(spec, key_json=rig.account.json())
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.HTTPError):
            await provider.send(http, model_request())
    assert rig.standin.requests == []


# --------------------------------------------------------------------------- refused early


async def test_the_catalogs_vertex_id_names_the_model_and_one_without_is_refused(
    rig: Rig,
) -> None:
    provider = rig.provider()
    async with httpx.AsyncClient() as http:
        with pytest.raises(ProviderRefusal) as refused:
            await provider.send(http, model_request("claude-unknown-9"))
        assert (refused.value.status, refused.value.kind) == (400, "invalid_request_error")
        assert "claude-unknown-9" in refused.value.message
        assert "providers.vertex" in refused.value.message
        assert rig.standin.requests == []  # not even a token was minted
        # An alias, and a newer dated id, go by the catalog entry they belong to.
        for model in ("claude-haiku-4-5-20251001", "claude-haiku-4-5-20991231"):
            assert (await answer(provider, http, model_request(model)))[0].status_code == 200
    assert [r["model"] for r in rig.received("predict")] == [VERTEX_ID, VERTEX_ID]


AUTHORIZED_USER = {
    "type": "authorized_user", "client_id": "x", "client_secret": "s3cr3t-client",
    "refresh_token": "s3cr3t-refresh-token",
}  # fmt: skip
NO_PRIVATE_KEY = {"type": "service_account", "client_email": "a@b.c", "private_key_id": "k"}
BAD_PEM = "-----BEGIN PRIVATE KEY-----\ns3cr3tbody\n-----END PRIVATE KEY-----\n"
UNUSABLE_KEYS = [
    (None, "no Google service-account key"),
    ("{not json: s3cr3t-value-in-the-file", "is not JSON"),
    (json.dumps(AUTHORIZED_USER), "'authorized_user'"),
    (json.dumps(NO_PRIVATE_KEY), "lacks private_key"),
    (json.dumps({**NO_PRIVATE_KEY, "private_key": BAD_PEM}), "is not a PEM private key"),
]


@pytest.mark.parametrize(
    ("key_json", "why"), UNUSABLE_KEYS,
    ids=["absent", "not-json", "authorized-user", "no-private-key", "bad-pem"],
)  # fmt: skip
async def test_an_unusable_key_is_refused_naming_the_secret_not_its_content(
    rig: Rig, key_json: str | None, why: str
) -> None:
    provider = VertexProvider(rig.spec, key_json=key_json)
    async with httpx.AsyncClient() as http:
        with pytest.raises(ProviderRefusal) as refused:
            await provider.send(http, model_request())
    assert (refused.value.status, refused.value.kind) == (401, "authentication_error")
    assert "credentials.gcpSecretRef" in refused.value.message
    assert why in refused.value.message
    assert "s3cr3t" not in refused.value.message
    assert rig.standin.requests == []


# --------------------------------------------------------------------------- the custodian


@contextmanager
def standin_process(*args: str) -> Iterator[dict[str, Any]]:
    """`python -m corral_dev.providers ...` as a process; yields its JSON line."""
    process = subprocess.Popen(
        [sys.executable, "-m", "corral_dev.providers", *args],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    lines: list[str] = []
    # A thread reads, so a stand-in that never prints fails the test instead of hanging it.
    reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
    stdout = process.stdout
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


def test_the_custodian_speaks_to_vertex_and_counts_the_usage(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    scripted.load(SCRIPT)
    key_file = tmp_path / "key.json"
    with standin_process(
        "vertex", "--upstream", scripted.url, "--project", PROJECT, "--region", REGION,
        "--key-out", str(key_file),
    ) as line:  # fmt: skip
        assert line == {"url": line["url"], "token_url": line["url"] + "/token",
                        "key_file": str(key_file)}  # fmt: skip
        assert json.loads(key_file.read_text())["token_uri"] == KEY_TOKEN_URI
        spec = ModelProvider(
            name="vertex-eu", type="vertex", project=PROJECT, region=REGION,
            endpoint_url=line["url"], token_url=line["token_url"],
        )  # fmt: skip
        env = {
            "CORRAL_MODEL_PROVIDER": spec.to_json(),
            "CORRAL_GCP_KEY_FILE": str(key_file),
            "CORRAL_AGENT_SPEC_JSON": json.dumps({"identity": "x", "model": MODEL}),
        }
        with running_custodian(env, tmp_path / "custodian.log") as custodian:
            body = {
                "model": MODEL, "max_tokens": 100, "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            }  # fmt: skip
            sent = httpx.post(custodian.url + "/v1/messages", json=body,
                              headers=custodian.headers, timeout=30)  # fmt: skip
            assert sent.status_code == 200, sent.text
            assert text_of(sent.content) == "hello from vertex"
            usage: Any = custodian.usage()
            assert (usage["usage"]["input"], usage["usage"]["output"]) == (120, 7)

            httpx.post(line["url"] + "/_standin/fail", timeout=10, json={
                "status": "RESOURCE_EXHAUSTED", "message": "Quota exceeded for "
                "aiplatform.googleapis.com/online_prediction_requests_per_base_model",
                "retry_after": "3"})  # fmt: skip
            limited = httpx.post(custodian.url + "/v1/messages", json=body,
                                 headers=custodian.headers, timeout=30)  # fmt: skip
            assert limited.status_code == 429
            assert limited.json()["error"]["type"] == "rate_limit_error"
            assert limited.json()["error"]["message"].startswith("Google Vertex AI: Quota")
            assert limited.headers["x-should-retry"] == "true"
            assert limited.headers["retry-after"] == "3"
            usage = custodian.usage()
            assert (usage["usage"]["input"], usage["usage"]["output"]) == (120, 7)

        received = httpx.get(line["url"] + "/_standin/requests", timeout=10).json()
        issued = httpx.get(line["url"] + "/_standin/issued", timeout=10).json()["tokens"]
    predicts = [r for r in received if r["kind"] == "predict"]
    assert [r["model"] for r in predicts] == [VERTEX_ID, VERTEX_ID]
    assert [r["action"] for r in predicts] == ["streamRawPredict"] * 2
    assert len([r for r in received if r["kind"] == "token"]) == 1 and len(issued) == 1
    # The minted token shows in nothing the custodian wrote.
    log = (tmp_path / "custodian.log").read_text()
    assert issued[0] not in log and issued[0] not in sent.text and issued[0] not in limited.text
