"""The Bedrock provider against the Bedrock and STS stand-in (corral_dev.providers._bedrock), on
loopback, with a fixed Messages API server behind it: real HTTP, real SigV4 (recomputed by the
stand-in with botocore), real event-stream frames (decoded here with botocore too).

Covered: a streamed answer arrives as the upstream's own SSE events (text, tool_use and its
input_json_delta, usage), and through the custodian process its usage is recorded; the model
id and the body as Bedrock wants them; signatures the stand-in refuses (a wrong secret, a
missing session token); web identity and AssumeRole chaining through STS, minted once, cached,
minted again near expiry (with the rotated token read again) and after a refusal; every
Bedrock refusal as the Anthropic error the engine knows; an exception frame mid-stream, a cut,
a truncated stream and a bad CRC; minted keys registered with the redactor.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
from botocore.credentials import Credentials  # type: ignore[import-untyped]
from botocore.eventstream import EventStreamBuffer  # type: ignore[import-untyped]
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from corral_api.providers import ModelProvider
from corral_common import sigv4
from corral_common.catalog import CATALOG_ENV
from corral_common.catalog import models as catalog_models
from corral_custodian import _secrets
from corral_custodian.providers import (
    ModelRequest,
    ProviderRefusal,
    StreamBroken,
    UpstreamAnswer,
)
from corral_custodian.providers._bedrock import BedrockProvider, bedrock_model_id
from corral_custodian.providers._eventstream import EventStreamDecoder
from corral_custodian.providers._sts import signed_headers
from corral_dev.providers._bedrock import BedrockStandIn, Fault, RunningStandIn, bind
from corral_dev.providers._bedrock import serve_in_thread as serve_standin

from ._custodian_proc import running_custodian

pytestmark = pytest.mark.timeout(60)

ACCESS_KEY = "AKIATESTBEDROCK00001"
SECRET = "test-secret-of-the-bedrock-standin-0001"
ROLE = "arn:aws:iam::123456789012:role/corral-bedrock"
MODEL = "claude-sonnet-4-5"
MODEL_ID = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
HAIKU_ID = "anthropic.claude-haiku-4-5-20251001-v1:0"
BETA = "interleaved-thinking-2025-05-14"

USAGE = {
    "input_tokens": 1200,
    "cache_read_input_tokens": 300,
    "cache_creation_input_tokens": 40,
    "output_tokens": 1,
}
EVENTS: list[dict[str, Any]] = [
    {"type": "message_start", "message": {
        "id": "msg_01", "type": "message", "role": "assistant", "model": MODEL, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": USAGE}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0,
     "delta": {"type": "text_delta", "text": "Listing the files."}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {
        "type": "tool_use", "id": "toolu_01", "name": "bash", "input": {}}},
    {"type": "content_block_delta", "index": 1,
     "delta": {"type": "input_json_delta", "partial_json": '{"command": '}},
    {"type": "content_block_delta", "index": 1,
     "delta": {"type": "input_json_delta", "partial_json": '"ls -la"}'}},
    {"type": "content_block_stop", "index": 1},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
     "usage": {"output_tokens": 57}},
    {"type": "message_stop"},
]  # fmt: skip
MESSAGE = {
    "id": "msg_02", "type": "message", "role": "assistant", "model": MODEL,
    "content": [{"type": "text", "text": "Hello."}], "stop_reason": "end_turn",
    "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 3},
}  # fmt: skip


def sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def parse_sse(data: bytes) -> list[tuple[str, bytes]]:
    """(event, data) pairs of an SSE text."""
    out = []
    for block in data.split(b"\n\n"):
        lines = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
        if b"event" in lines:
            out.append((lines[b"event"].decode(), lines[b"data"]))
    return out


# ----------------------------------------------------------------------------- the servers


class FixedMessages:
    """A Messages API server that answers every request with the same events (or `fail`)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail: tuple[int, str, str] | None = None
        self.app = Starlette(routes=[Route("/v1/messages", self._messages, methods=["POST"])])

    async def _messages(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "body": body})
        if self.fail is not None:
            status, kind, message = self.fail
            error = {"type": "error", "error": {"type": kind, "message": message}}
            return JSONResponse(error, status_code=status)
        if body.get("stream"):
            return StreamingResponse(iter([sse(e) for e in EVENTS]), media_type="text/event-stream")
        return JSONResponse(MESSAGE)


@dataclass
class Served:
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


def serve(app: Any) -> Served:
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.01)
    return Served(f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread)


@pytest.fixture(scope="module")
def upstream_server() -> Iterator[tuple[FixedMessages, str]]:
    fixed = FixedMessages()
    served = serve(fixed.app)
    try:
        yield fixed, served.url
    finally:
        served.stop()


@pytest.fixture
def upstream(upstream_server: tuple[FixedMessages, str]) -> tuple[FixedMessages, str]:
    """The fixed Messages server, as new: no requests, no failure."""
    upstream_server[0].requests.clear()
    upstream_server[0].fail = None
    return upstream_server


StandInFactory = Callable[..., RunningStandIn]


@pytest.fixture
def standins(upstream: tuple[FixedMessages, str]) -> Iterator[StandInFactory]:
    """Start Bedrock stand-ins (our key, our role) in front of the fixed upstream."""
    running: list[RunningStandIn] = []

    def start(**fields: Any) -> RunningStandIn:
        fields = {"access_key_id": ACCESS_KEY, "secret_access_key": SECRET,
                  "role_arns": (ROLE,), **fields}  # fmt: skip
        running.append(serve_standin(BedrockStandIn(upstream=upstream[1], **fields)))
        return running[-1]

    yield start
    for one in running:
        one.stop()


@pytest.fixture
def standin(standins: StandInFactory) -> RunningStandIn:
    return standins()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=20) as client:
        yield client


OUR_KEY = sigv4.Credentials(ACCESS_KEY, SECRET)


def provider(
    standin: RunningStandIn,
    credentials: sigv4.Credentials | None = OUR_KEY,
    token_file: Path | None = None,
    **fields: Any,
) -> BedrockProvider:
    spec = ModelProvider(
        name="bedrock-test", type="bedrock", region=standin.standin.region,
        endpoint_url=standin.url, sts_url=standin.url, **fields,
    )  # fmt: skip
    return BedrockProvider(
        spec, credentials=credentials, web_identity_token_file=token_file,
        session_name="corral-agents-fix-the-tests",
    )  # fmt: skip


def request(stream: bool = True, model: str = MODEL, beta: str | None = BETA) -> ModelRequest:
    body = {"model": model, "max_tokens": 100, "stream": stream,
            "messages": [{"role": "user", "content": "list the files"}]}  # fmt: skip
    headers = {"anthropic-version": "2023-06-01"}
    if beta:
        headers["anthropic-beta"] = beta
    return ModelRequest(model, body, headers)


async def answer_of(
    bedrock: BedrockProvider, http: httpx.AsyncClient, req: ModelRequest | None = None
) -> tuple[UpstreamAnswer, bytes]:
    answer = await bedrock.send(http, req or request())
    try:
        data = b"".join([piece async for piece in answer.stream()])
    finally:
        await answer.aclose()
    return answer, data


def error_of(data: bytes) -> tuple[str, str]:
    error = json.loads(data)["error"]
    return error["type"], error["message"]


def jwt(audience: str | list[str] = "sts.amazonaws.com", subject: str = "agents") -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    claims = {"aud": audience, "sub": f"system:serviceaccount:{subject}:corral-sandbox",
              "exp": int(time.time()) + 3600, "iss": "https://oidc.example"}  # fmt: skip
    return f"{part({'alg': 'RS256', 'kid': 'k'})}.{part(claims)}.c2lnbmF0dXJlLW5vdC1jaGVja2Vk"


# ------------------------------------------------------------------------------ the answers


def assert_the_upstreams_events(data: bytes) -> None:
    relayed = parse_sse(data)
    assert [kind for kind, _ in relayed] == [e["type"] for e in EVENTS]
    # Byte for byte, the upstream's JSON; message_stop as Bedrock sends it, with its metrics.
    assert [d for _, d in relayed[:-1]] == [json.dumps(e).encode() for e in EVENTS[:-1]]
    stop = json.loads(relayed[-1][1])
    assert stop.pop("amazon-bedrock-invocationMetrics")["outputTokenCount"] == 57
    assert stop == {"type": "message_stop"}


async def test_a_streamed_answer_arrives_as_the_upstreams_events(
    standin: RunningStandIn, upstream: tuple[FixedMessages, str], http: httpx.AsyncClient
) -> None:
    answer, data = await answer_of(provider(standin), http)
    assert answer.status_code == 200 and answer.is_stream
    assert answer.headers["content-type"] == "text/event-stream"
    assert_the_upstreams_events(data)
    # What Bedrock received: the model's id with the region's profile, the beta in the body.
    forwarded = standin.standin.forwarded[-1]
    assert forwarded["model_id"] == MODEL_ID
    assert forwarded["operation"] == "invoke-with-response-stream"
    assert forwarded["anthropic_beta"] == [BETA]
    # What the stand-in sent on: Messages API terms again.
    sent = upstream[0].requests[-1]
    assert sent["body"]["model"] == MODEL and sent["body"]["stream"] is True
    assert "anthropic_version" not in sent["body"] and "anthropic_beta" not in sent["body"]
    assert sent["headers"]["anthropic-beta"] == BETA


async def test_an_answer_not_streamed_is_the_messages_json(
    standin: RunningStandIn, http: httpx.AsyncClient
) -> None:
    answer = await provider(standin).send(http, request(stream=False, beta=None))
    try:
        assert answer.status_code == 200 and not answer.is_stream
        assert json.loads(await answer.read()) == MESSAGE
        assert set(answer.headers) == {"content-type"}  # x-amzn-* stays out
    finally:
        await answer.aclose()
    forwarded = standin.standin.forwarded[-1]
    assert forwarded["operation"] == "invoke" and forwarded["anthropic_beta"] is None


@pytest.mark.parametrize(
    ("region", "cross_region", "model", "expected"),
    [
        ("us-east-1", True, "claude-haiku-4-5-20251001", "us." + HAIKU_ID),
        ("eu-west-1", True, MODEL, "eu.anthropic.claude-sonnet-4-5-20250929-v1:0"),
        ("ap-southeast-2", True, "claude-opus-4-6", "apac.anthropic.claude-opus-4-6-v1"),
        ("us-west-2", False, MODEL, "anthropic.claude-sonnet-4-5-20250929-v1:0"),
        # A newer dated id of a known model: the longest catalog name it starts with.
        ("us-east-1", True, "claude-sonnet-4-5-20991231", MODEL_ID),
    ],
)  # fmt: skip
async def test_the_model_id_is_the_catalogs_with_the_regions_profile(
    standins: StandInFactory,
    http: httpx.AsyncClient,
    region: str,
    cross_region: bool,
    model: str,
    expected: str,
) -> None:
    standin = standins(region=region)
    bedrock = provider(standin, cross_region=cross_region)
    answer, _ = await answer_of(bedrock, http, request(model=model))
    assert answer.status_code == 200
    assert standin.standin.forwarded[-1]["model_id"] == expected


def test_ids_with_a_geography_or_an_arn_are_used_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prices = {"input": 1.0, "output": 1.0, "cacheRead": 0.1, "cacheWrite": 1.25}
    arn = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc"
    overlay = {"models": [
        {"name": name, "contextWindow": 200000, "maxOutputTokens": 8192, "prices": prices,
         "providers": {"bedrock": model_id}}
        for name, model_id in [("test-global", "global.anthropic.test-v1:0"),
                               ("test-arn", arn), ("test-eu", "eu.anthropic.test-v1:0")]
    ]}  # fmt: skip
    (tmp_path / "catalog.json").write_text(json.dumps(overlay))
    monkeypatch.setenv(CATALOG_ENV, str(tmp_path / "catalog.json"))
    catalog_models.cache_clear()
    try:
        assert bedrock_model_id("test-global", "us") == "global.anthropic.test-v1:0"
        assert bedrock_model_id("test-arn", "us") == arn
        assert bedrock_model_id("test-eu", "us") == "eu.anthropic.test-v1:0"
        assert bedrock_model_id(MODEL, "") == "anthropic.claude-sonnet-4-5-20250929-v1:0"
        assert bedrock_model_id("claude-opus-4-5-20251101", "eu") == (
            "eu.anthropic.claude-opus-4-5-20251101-v1:0"
        )
        assert bedrock_model_id("gpt-4o", "us") is None
    finally:
        monkeypatch.delenv(CATALOG_ENV)
        catalog_models.cache_clear()


async def test_a_model_without_a_bedrock_id_is_refused_before_anything_is_sent(
    standin: RunningStandIn, http: httpx.AsyncClient
) -> None:
    with pytest.raises(ProviderRefusal) as refused:
        await provider(standin).send(http, request(model="gpt-4o"))
    assert (refused.value.status, refused.value.kind) == (400, "invalid_request_error")
    assert "no Amazon Bedrock id" in refused.value.message
    assert "providers.bedrock" in refused.value.message
    assert standin.standin.forwarded == []


# ---------------------------------------------------------------------------- signatures


def botocore_signed(url: str, body: bytes, secret: str, region: str = "us-east-1") -> AWSRequest:
    signed = AWSRequest(method="POST", url=url, data=body,
                        headers={"content-type": "application/json"})  # fmt: skip
    SigV4Auth(Credentials(ACCESS_KEY, secret), "bedrock", region).add_auth(signed)
    return signed


async def test_the_standin_recomputes_every_signature(
    standin: RunningStandIn, upstream: tuple[FixedMessages, str], http: httpx.AsyncClient
) -> None:
    # Signed with a wrong secret by the custodian: refused, and nothing goes upstream.
    wrong = provider(standin, sigv4.Credentials(ACCESS_KEY, SECRET + "-wrong"))
    answer, data = await answer_of(wrong, http)
    assert answer.status_code == 401
    kind, message = error_of(data)
    assert kind == "authentication_error"
    assert message.startswith("Amazon Bedrock: The request signature we calculated does not")
    assert upstream[0].requests == []
    # The stand-in's check is botocore's: what botocore signs passes, a changed byte does not.
    url = f"{standin.url}/model/{MODEL_ID.replace(':', '%3A')}/invoke"
    body = json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 5,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
    for secret, sent, region, status, error_type in [
        (SECRET, body, "us-east-1", 200, None),
        (SECRET, body.replace(b"hi", b"ho"), "us-east-1", 403, "InvalidSignatureException"),
        (SECRET + "x", body, "us-east-1", 403, "InvalidSignatureException"),
        (SECRET, body, "eu-west-1", 403, "InvalidSignatureException"),
    ]:
        signed = botocore_signed(url, body, secret, region)
        response = await http.post(url, content=sent, headers=dict(signed.headers.items()))
        assert response.status_code == status, response.text
        if error_type:
            assert response.headers["x-amzn-errortype"].startswith(error_type + ":")


async def test_a_session_token_is_sent_signed_and_checked(
    standins: StandInFactory, http: httpx.AsyncClient
) -> None:
    token = "FwoGZXIvYXdzEXAMPLE-session-token-of-the-test-0001"
    standin = standins(session_token=token)
    answer, data = await answer_of(
        provider(standin, sigv4.Credentials(ACCESS_KEY, SECRET, token)), http
    )
    assert answer.status_code == 200
    assert_the_upstreams_events(data)
    # The key alone, without its session token, is not the key.
    answer, data = await answer_of(provider(standin, sigv4.Credentials(ACCESS_KEY, SECRET)), http)
    assert answer.status_code == 401
    assert error_of(data) == (
        "authentication_error",
        "Amazon Bedrock: The security token included in the request is invalid.",
    )


# --------------------------------------------------------------------- minted credentials


async def test_web_identity_mints_once_and_again_near_expiry_with_the_rotated_token(
    standin: RunningStandIn, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    first, second = jwt(subject="first"), jwt(subject="second")
    token_file.write_text(first + "\n")
    bedrock = provider(standin, None, token_file, role_arn=ROLE, web_identity=True)
    # Concurrent requests share one exchange.
    answers = await asyncio.gather(*(answer_of(bedrock, http) for _ in range(3)))
    assert [a.status_code for a, _ in answers] == [200, 200, 200]
    calls = standin.standin.sts_calls
    assert [(c["action"], c["token"], c["role_arn"]) for c in calls] == [
        ("AssumeRoleWithWebIdentity", first, ROLE)
    ]
    assert calls[0]["session_name"] == "corral-agents-fix-the-tests"
    used = {f["access_key_id"] for f in standin.standin.forwarded}
    assert used == {calls[0]["issued"]} and calls[0]["issued"].startswith("ASIA")
    # The kubelet rotates the token; the keys in hand are used until 5 minutes before expiry.
    token_file.write_text(second)
    await answer_of(bedrock, http)
    assert len(calls) == 1
    bedrock.clock = lambda: time.time() + 3600 - 299
    answer, data = await answer_of(bedrock, http)
    assert answer.status_code == 200
    assert_the_upstreams_events(data)
    assert [c["token"] for c in calls] == [first, second]
    assert standin.standin.forwarded[-1]["access_key_id"] == calls[1]["issued"]
    # Every minted secret, session token and token read is in the redactor's book.
    issued = httpx.get(standin.url + "/_standin/issued").json()["values"]
    assert len(issued) == 4
    text = " ".join([*issued, first, second])
    redacted = _secrets.redact(text)
    assert all(value not in redacted for value in [*issued, first, second]), redacted
    assert "[redacted:minted-credential]" in redacted
    assert "[redacted:aws-web-identity-token]" in redacted


async def test_sts_refusals_are_permission_errors(
    standin: RunningStandIn, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(jwt(audience="https://kubernetes.default.svc"))
    bedrock = provider(standin, None, token_file, role_arn=ROLE, web_identity=True)
    with pytest.raises(ProviderRefusal) as refused:
        await bedrock.send(http, request())
    assert (refused.value.status, refused.value.kind) == (403, "permission_error")
    assert refused.value.message == "AWS STS: InvalidIdentityToken: Incorrect token audience"
    # STS throttling: retryable.
    token_file.write_text(jwt())
    standin.standin.add_fault(Fault("sts_error", status=400, type="Throttling", message="Rate"))
    with pytest.raises(ProviderRefusal) as refused:
        await bedrock.send(http, request())
    assert (refused.value.status, refused.value.kind, refused.value.retry) == (
        429, "rate_limit_error", True,
    )  # fmt: skip
    assert standin.standin.forwarded == []


async def test_assume_role_chains_from_the_agents_keys(
    standin: RunningStandIn, http: httpx.AsyncClient
) -> None:
    answer, data = await answer_of(provider(standin, role_arn=ROLE), http)
    assert answer.status_code == 200
    assert_the_upstreams_events(data)
    (call,) = standin.standin.sts_calls
    assert (call["action"], call["caller"], call["role_arn"]) == ("AssumeRole", ACCESS_KEY, ROLE)
    forwarded = standin.standin.forwarded[-1]
    assert (forwarded["access_key_id"], forwarded["issued_by"]) == (call["issued"], "AssumeRole")
    # STS checks the signature of AssumeRole (with botocore), and the role.
    wrong = provider(standin, sigv4.Credentials(ACCESS_KEY, "not-the-secret"), role_arn=ROLE)
    with pytest.raises(ProviderRefusal, match=r"^AWS STS: SignatureDoesNotMatch: The request"):
        await wrong.send(http, request())
    other = provider(standin, role_arn="arn:aws:iam::123456789012:role/another")
    with pytest.raises(ProviderRefusal, match="AccessDenied: Not authorized") as refused:
        await other.send(http, request())
    assert refused.value.status == 403


async def test_minted_keys_refused_by_bedrock_are_minted_again(
    standin: RunningStandIn, http: httpx.AsyncClient
) -> None:
    bedrock = provider(standin, role_arn=ROLE)
    assert (await answer_of(bedrock, http))[0].status_code == 200
    standin.standin.expire_issued()
    answer, data = await answer_of(bedrock, http)
    assert (answer.status_code, answer.headers["x-should-retry"]) == (401, "false")
    assert error_of(data) == (
        "authentication_error",
        "Amazon Bedrock: The security token included in the request is expired",
    )
    answer, data = await answer_of(bedrock, http)
    assert answer.status_code == 200
    assert len(standin.standin.sts_calls) == 2


@pytest.mark.parametrize(
    ("fields", "token", "says"),
    [
        ({}, None, "set the Agent's credentials.awsSecretRef"),
        ({"role_arn": ROLE, "web_identity": True}, None, "CORRAL_AWS_WEB_IDENTITY_TOKEN_FILE"),
        ({"role_arn": ROLE, "web_identity": True}, "missing", "cannot be read"),
        ({"role_arn": ROLE}, None, "or the provider's webIdentity"),
    ],
    ids=["no-keys", "no-token-file", "unreadable-token", "role-without-means"],
)
async def test_no_usable_credential_is_refused_naming_what_to_set(
    standin: RunningStandIn,
    http: httpx.AsyncClient,
    tmp_path: Path,
    fields: dict[str, Any],
    token: str | None,
    says: str,
) -> None:
    token_file = tmp_path / token if token else None
    with pytest.raises(ProviderRefusal, match=says) as refused:
        await provider(standin, None, token_file, **fields).send(http, request())
    assert (refused.value.status, refused.value.kind) == (401, "authentication_error")


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("status", "exception", "expected", "kind", "retry"),
    [
        (429, "ThrottlingException", 429, "rate_limit_error", "true"),
        (429, "ServiceQuotaExceededException", 429, "rate_limit_error", "false"),
        (403, "AccessDeniedException", 403, "permission_error", "false"),
        (404, "ResourceNotFoundException", 404, "not_found_error", "false"),
        (400, "ValidationException", 400, "invalid_request_error", "false"),
        (503, "ServiceUnavailableException", 529, "overloaded_error", "true"),
        (429, "ModelNotReadyException", 529, "overloaded_error", "true"),
        (408, "ModelTimeoutException", 504, "api_error", "false"),
        (500, "InternalServerException", 500, "api_error", "true"),
        (418, "TeapotException", 418, "api_error", "false"),
    ],
)
async def test_bedrock_refusals_become_the_anthropic_errors(
    standin: RunningStandIn,
    http: httpx.AsyncClient,
    status: int,
    exception: str,
    expected: int,
    kind: str,
    retry: str,
) -> None:
    standin.standin.add_fault(Fault("error", status=status, type=exception, message="said so"))
    answer, data = await answer_of(provider(standin), http)
    assert (answer.status_code, answer.headers["x-should-retry"]) == (expected, retry)
    assert answer.headers["content-type"] == "application/json"
    assert error_of(data) == (kind, "Amazon Bedrock: said so")


async def test_an_unknown_model_and_an_upstream_refusal_come_back_translated(
    standins: StandInFactory, upstream: tuple[FixedMessages, str], http: httpx.AsyncClient
) -> None:
    standin = standins(models={HAIKU_ID: "claude-haiku-4-5"})
    answer, data = await answer_of(provider(standin), http)
    assert answer.status_code == 400
    assert error_of(data) == (
        "invalid_request_error",
        "Amazon Bedrock: The provided model identifier is invalid.",
    )
    upstream[0].fail = (429, "rate_limit_error", "Number of request tokens has exceeded")
    answer, data = await answer_of(provider(standin), http, request(model="claude-haiku-4-5"))
    assert (answer.status_code, answer.headers["x-should-retry"]) == (429, "true")
    assert error_of(data) == (
        "rate_limit_error",
        "Amazon Bedrock: Number of request tokens has exceeded",
    )


@pytest.mark.parametrize(
    ("exception", "kind"),
    [
        ("throttlingException", "rate_limit_error"),
        ("modelStreamErrorException", "api_error"),
        ("serviceUnavailableException", "overloaded_error"),
        ("validationException", "invalid_request_error"),
    ],
)
async def test_an_exception_frame_mid_stream_becomes_an_error_event(
    standin: RunningStandIn, http: httpx.AsyncClient, exception: str, kind: str
) -> None:
    fault = Fault("exception_frame", type=exception, message="stopped", after_events=3)
    standin.standin.add_fault(fault)
    _, data = await answer_of(provider(standin), http)
    relayed = parse_sse(data)
    assert [k for k, _ in relayed] == [e["type"] for e in EVENTS[:3]] + ["error"]
    assert json.loads(relayed[-1][1]) == {
        "type": "error",
        "error": {"type": kind, "message": "Amazon Bedrock: stopped"},
    }


@pytest.mark.parametrize("kind", ["cut", "truncate", "bad_crc"])
async def test_a_broken_stream_raises_for_the_proxy(
    standin: RunningStandIn, http: httpx.AsyncClient, kind: str
) -> None:
    standin.standin.add_fault(Fault(kind, after_events=2))
    answer = await provider(standin).send(http, request())
    got: list[bytes] = []
    try:
        with pytest.raises((StreamBroken, httpx.HTTPError)) as broken:
            async for piece in answer.stream():
                got.append(piece)
    finally:
        await answer.aclose()
    assert [k for k, _ in parse_sse(b"".join(got))] == ["message_start", "content_block_start"]
    if kind != "cut":  # a dropped connection may show as httpx's error or as a broken frame
        assert isinstance(broken.value, StreamBroken)
        assert ("CRC" if kind == "bad_crc" else "ended inside a message") in str(broken.value)


async def test_the_standins_frames_decode_alike_with_botocore_and_ours(
    standin: RunningStandIn, http: httpx.AsyncClient
) -> None:
    url = httpx.URL(
        f"{standin.url}/model/{MODEL_ID.replace(':', '%3A')}/invoke-with-response-stream"
    )
    body = json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 5,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
    headers = signed_headers(
        "POST", url, body, {"content-type": "application/json"},
        credentials=sigv4.Credentials(ACCESS_KEY, SECRET), region="us-east-1", service="bedrock",
    )  # fmt: skip
    response = await http.post(url, content=body, headers=headers)
    assert response.headers["content-type"] == "application/vnd.amazon.eventstream"
    raw = response.content
    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    theirs = [(dict(m.headers), bytes(m.payload)) for m in buffer]
    decoder = EventStreamDecoder()
    mine = [(dict(m.headers), m.payload) for i in range(0, len(raw), 7)
            for m in decoder.feed(raw[i : i + 7])]  # fmt: skip
    decoder.finish()
    assert mine == theirs and len(mine) == len(EVENTS)
    assert mine[0][0] == {":event-type": "chunk", ":content-type": "application/json",
                          ":message-type": "event"}  # fmt: skip
    assert base64.b64decode(json.loads(mine[0][1])["bytes"]) == json.dumps(EVENTS[0]).encode()


# ---------------------------------------------------------------------- the whole custodian


@dataclass
class StandInProcess:
    url: str
    line: dict[str, Any]

    def hook(self, path: str, payload: Any = None) -> Any:
        response = httpx.request(
            "POST" if payload is not None else "GET", self.url + path, json=payload, timeout=5
        )
        response.raise_for_status()
        return response.json()


@pytest.fixture
def standin_process(
    upstream: tuple[FixedMessages, str], tmp_path: Path
) -> Iterator[StandInProcess]:
    """The stand-in as its command runs it: `python -m corral_dev.providers bedrock`."""
    argv = [sys.executable, "-m", "corral_dev.providers", "bedrock", "--upstream", upstream[1],
            "--region", "us-west-2", "--access-key", ACCESS_KEY, "--secret-key", SECRET,
            "--role-arn", ROLE, "--port", "0"]  # fmt: skip
    with (tmp_path / "standin.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log)
    assert process.stdout is not None
    try:
        first = process.stdout.readline()
        assert first, f"the stand-in did not start: {(tmp_path / 'standin.log').read_text()}"
        line = json.loads(first)
        yield StandInProcess(line["url"], line)
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()


def custodian_env(standin: StandInProcess, tmp_path: Path, **fields: Any) -> dict[str, str]:
    spec = ModelProvider(
        name="bedrock-us", type="bedrock", region="us-west-2", endpoint_url=standin.url,
        sts_url=standin.url, **fields,
    )  # fmt: skip
    return {
        "CORRAL_MODEL_PROVIDER": spec.to_json(),
        "CORRAL_AGENT_SPEC_JSON": json.dumps({"identity": "x", "model": MODEL}),
        "CORRAL_SESSION_NAME": "fix-the-tests",
        "CORRAL_SESSION_NAMESPACE": "agents",
    }


def post_messages(url: str, headers: dict[str, str]) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": "list the files"}]}  # fmt: skip
    return httpx.post(
        url + "/v1/messages", json=body, timeout=20,
        headers={**headers, "anthropic-version": "2023-06-01", "anthropic-beta": BETA},
    )  # fmt: skip


def test_the_custodian_relays_bedrock_and_records_the_upstreams_usage(
    standin_process: StandInProcess, tmp_path: Path
) -> None:
    assert standin_process.line["region"] == "us-west-2"
    keys = tmp_path / "aws"
    keys.mkdir()
    (keys / "aws_access_key_id").write_text(ACCESS_KEY + "\n")
    (keys / "aws_secret_access_key").write_text(SECRET + "\n")
    env = {**custodian_env(standin_process, tmp_path), "CORRAL_AWS_CREDENTIALS_DIR": str(keys)}
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        response = post_messages(custodian.url, custodian.headers)
        assert response.status_code == 200, response.text
        assert_the_upstreams_events(response.content)
        totals: Any = custodian.usage()["usage"]
        assert (totals["input"], totals["output"], totals["cacheRead"], totals["cacheWrite"]) == (
            1200, 57, 300, 40,
        )  # fmt: skip
        (forwarded,) = standin_process.hook("/_standin/requests")
        assert forwarded["model_id"] == MODEL_ID and forwarded["anthropic_beta"] == [BETA]
        # Throttled: the SDK may retry; a cut mid-frame: the proxy's api_error event.
        standin_process.hook("/_standin/faults", {"kind": "error", "status": 429,
                                                  "type": "ThrottlingException"})  # fmt: skip
        response = post_messages(custodian.url, custodian.headers)
        assert (response.status_code, response.headers["x-should-retry"]) == (429, "true")
        assert response.json()["error"]["type"] == "rate_limit_error"
        standin_process.hook("/_standin/faults", {"kind": "cut", "after_events": 4})
        response = post_messages(custodian.url, custodian.headers)
        (kind, data) = parse_sse(response.content)[-1]
        assert kind == "error" and json.loads(data)["error"]["type"] == "api_error"
        assert "broke off" in json.loads(data)["error"]["message"]


def test_the_custodian_exchanges_its_web_identity_and_never_shows_the_keys(
    standin_process: StandInProcess, tmp_path: Path
) -> None:
    token_file = tmp_path / "sts-token"
    token = jwt()
    token_file.write_text(token)
    env = {
        **custodian_env(standin_process, tmp_path, role_arn=ROLE, web_identity=True),
        "CORRAL_AWS_WEB_IDENTITY_TOKEN_FILE": str(token_file),
    }
    log = tmp_path / "custodian.log"
    with running_custodian(env, log) as custodian:
        response = post_messages(custodian.url, custodian.headers)
        assert response.status_code == 200, response.text
        assert_the_upstreams_events(response.content)
        (call,) = standin_process.hook("/_standin/sts")
        assert call["action"] == "AssumeRoleWithWebIdentity"
        assert call["session_name"] == "corral-agents-fix-the-tests"
    issued = standin_process.hook("/_standin/issued")["values"]
    assert len(issued) == 2
    text = log.read_text()
    assert not [value for value in [*issued, token] if value in text]
