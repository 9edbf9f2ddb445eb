"""No credential text leaves the custodian: the real `corral-custodian` process answers and logs
the model key only as a marker, whatever form a text carries it in (here base64 and
URL-encoded, put there by a caller), passes the provider's event stream through untouched,
and refuses to start with a credential too short to redact, naming it. In process, the
operator listener's delivery record leaves redacted too."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from aiohttp import web
from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from corral_api.hook_spec import AgentHooks
from corral_api.wire import DeliveryRecord
from corral_custodian import _secrets
from corral_custodian._adopt import PooledCustodian
from corral_custodian._app import Custodian, create_operator_app
from corral_custodian._hooks import HookProblem, hook_headers
from corral_custodian._kube import kube_client
from corral_custodian._secrets import RedactResponses, SecretRegistry
from corral_custodian.settings import KubeSettings, from_env, register_credentials
from corral_kube import KubeConfigError
from tests._scripted import ScriptedServer
from tests.unit.kube._apiserver import ApiServer

from ._custodian_proc import CUSTODIAN, running_custodian

pytestmark = pytest.mark.timeout(60)

# '/', '+' and '=' make its URL-encoded form differ from the value.
MODEL_KEY = "sk-ant-api03/" + secrets.token_urlsafe(24) + "+Zz=="
B64 = base64.b64encode(MODEL_KEY.encode()).decode()
B64_URL = base64.urlsafe_b64encode(MODEL_KEY.encode()).decode().rstrip("=")
URL_ENCODED = quote(MODEL_KEY, safe="")
MARK = "[redacted:model-key]"
AGENT = json.dumps(
    {"identity": "x", "model": "claude-haiku-4-5", "tools": {"allow": ["mcp__corral__*"]}}
)


@pytest.fixture
def upstream(scripted: ScriptedServer) -> str:
    """The scripted model, answering with the key's base64 as its text (as if it knew it)."""
    scripted.load({"default": [{"text": f"the key is {B64}"}, {"text": f"the key is {B64}"}]})
    return scripted.url


def _leaks(text: str) -> list[str]:
    return [form for form in (MODEL_KEY, B64, B64_URL, URL_ENCODED) if form in text]


def test_the_real_custodian_answers_and_logs_the_model_key_only_redacted(
    tmp_path: Path, upstream: str
) -> None:
    env = {
        "CORRAL_AGENT_SPEC_JSON": AGENT,
        "ANTHROPIC_API_KEY": MODEL_KEY,
        "CORRAL_UPSTREAM_URL": upstream,
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        "CORRAL_LOG_LEVEL": "info",
    }
    with running_custodian(env, tmp_path / "custodian.log") as custodian:
        with custodian.client() as client:
            # A tool result (the Menu's 404 reads as one) naming what the caller sent: once the
            # base64 of the key, once its URL encoding (the path is decoded once by the server).
            for form in (B64, URL_ENCODED):
                answer = client.post(f"/agents/c1/tools/{quote(form, safe='')}", json={})
                assert answer.status_code == 404, answer.text
                body = answer.json()
                assert body["isError"] is True and MARK in body["content"], body
                assert _leaks(answer.text) == [], answer.text
                assert int(answer.headers["content-length"]) == len(answer.content)
            # An error of another route, in the URL-safe alphabet.
            answer = client.get(f"/approvals/{B64_URL}")
            assert answer.status_code == 404 and MARK in answer.json()["reason"]
            assert _leaks(answer.text) == []
            # A non-streamed model answer is a body the custodian relays whole: redacted.
            request = {
                "model": "claude-haiku-4-5",
                "max_tokens": 50,
                "messages": [{"role": "user", "content": "hi"}],
            }
            answered = client.post("/v1/messages", json=request, headers={"x-api-key": "x"})
            assert answered.status_code == 200, answered.text
            assert MARK in answered.text and _leaks(answered.text) == []
            # The provider's event stream passes through as it arrives, byte for byte: the
            # model never saw the key, and the stream is not held back to be searched.
            with client.stream("POST", "/v1/messages", json={**request, "stream": True}) as s:
                assert s.status_code == 200
                assert s.headers["content-type"].startswith("text/event-stream")
                streamed = b"".join(s.iter_raw()).decode()
            said = "".join(
                event["delta"]["text"]
                for event in (
                    json.loads(line[len("data: ") :])
                    for line in streamed.splitlines()
                    if line.startswith("data: ")
                )
                if event.get("type") == "content_block_delta"
            )
            assert said == f"the key is {B64}" and MARK not in streamed
        # A caller without the credential is refused, and the refusal's log line names the
        # path it tried: the key in it is a marker in the log.
        refused = httpx.post(f"{custodian.url}/agents/c1/tools/{quote(B64, safe='')}", json={})
        assert refused.status_code == 401
        with custodian.client() as client:  # a request after it: the line is written by then
            assert client.get("/readyz").status_code == 200
    log = custodian.log.read_text()
    assert f"/agents/c1/tools/{MARK} from 127.0.0.1:" in log, log
    assert _leaks(log) == [], log


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"ANTHROPIC_API_KEY": "sk-12"}, "the model key (ANTHROPIC_API_KEY"),
        ({"CORRAL_MODEL_KEY_FILE": "key"}, "CORRAL_MODEL_KEY_FILE"),
        ({"CORRAL_CUSTODIAN_CREDENTIAL_FILE": "key"}, "CORRAL_CUSTODIAN_CREDENTIAL_FILE"),
    ],
)
def test_the_real_custodian_refuses_to_start_with_a_5_character_credential(
    tmp_path: Path, env: dict[str, str], named: str
) -> None:
    short = "sk-12"
    (tmp_path / "key").write_text(short + "\n")
    full = {
        "PATH": "/usr/bin:/bin",
        "CORRAL_AGENT_SPEC_JSON": AGENT,
        "CORRAL_CUSTODIAN_INSECURE": "1",
    }
    full.update({k: str(tmp_path / v) if v == "key" else v for k, v in env.items()})
    done = subprocess.run([str(CUSTODIAN)], env=full, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr and "5 characters long; at least 8" in done.stderr, done.stderr
    assert short not in done.stderr


def test_the_operator_listener_returns_the_delivery_record_redacted(
    tmp_path: Path,
) -> None:
    token = "wire-" + secrets.token_urlsafe(24)
    (tmp_path / "token").write_text(token)
    settings = from_env(
        {
            "CORRAL_AGENT_SPEC_JSON": AGENT,
            "CORRAL_CUSTODIAN_INSECURE": "1",
            "ANTHROPIC_API_KEY": MODEL_KEY,
            "CORRAL_CUSTODIAN_OPERATOR_ADDR": "127.0.0.1:18082",
            "CORRAL_WIRE_TOKEN_FILE": str(tmp_path / "token"),
            "CORRAL_STATE_DIR": str(tmp_path / "state"),
        }
    )
    _secrets.registry.clear()
    try:
        register_credentials(settings)
        core = Custodian(settings)
        core.deliveries.record = DeliveryRecord(
            state="Failed",
            branch="corral/s1",
            message=f"push_failed: unterminated line in ./packed-refs: {B64} / {URL_ENCODED}",
        )
        app = RedactResponses(create_operator_app(core))
        with TestClient(app) as client:
            answer = client.get("/v1/delivery", headers={"authorization": f"Bearer {token}"})
        assert answer.status_code == 200
        message = answer.json()["delivery"]["message"]
        assert message == f"push_failed: unterminated line in ./packed-refs: {MARK} / {MARK}"
        # The same app without the layer would have said it: the layer is what redacts.
        with TestClient(create_operator_app(core)) as client:
            raw = client.get("/v1/delivery", headers={"authorization": f"Bearer {token}"})
        assert B64 in raw.text
    finally:
        _secrets.registry.clear()


def test_the_response_layer_uses_the_registry_it_is_given() -> None:
    async def say(request: Request) -> PlainTextResponse:
        return PlainTextResponse(f"say {B64} and {MODEL_KEY}")

    mine = SecretRegistry()
    mine.register("model-key", MODEL_KEY)
    with TestClient(RedactResponses(Starlette(routes=[Route("/anything", say)]), mine)) as client:
        answer = client.get("/anything")
    assert answer.text == f"say {MARK} and {MARK}"
    assert answer.headers["content-length"] == str(len(answer.content))


# --- credentials that arrive or change after the start -----------------------------------------


@pytest.fixture
def clean_registry() -> Iterator[SecretRegistry]:
    _secrets.registry.clear()
    yield _secrets.registry
    _secrets.registry.clear()


def test_a_pooled_custodian_registers_what_the_adopt_delivers_and_echoes_none_of_it(
    tmp_path: Path, clean_registry: SecretRegistry
) -> None:
    key = secrets.token_urlsafe(32)
    env = {
        "CORRAL_CUSTODIAN_ADDR": "127.0.0.1:18081",
        "CORRAL_CUSTODIAN_OPERATOR_ADDR": "127.0.0.1:18082",
        "CORRAL_STATE_DIR": str(tmp_path / "state"),
        "ANTHROPIC_API_KEY": MODEL_KEY,
    }
    pooled = PooledCustodian(env, hashlib.sha256(key.encode()).hexdigest())
    adopt = {
        "wireToken": "w-" + secrets.token_urlsafe(32),
        "custodianCredential": "c-" + secrets.token_urlsafe(32),
        "session": {"name": "s1", "namespace": "team", "uid": "uid-1"},
        "agentName": "coder",
        "agent": json.loads(AGENT),
        "branch": "corral/s1",
        "gitRemoteUrl": "https://example.invalid/r.git",
    }
    # No `with`: the gate serves http only, as uvicorn runs it (lifespan off).
    client = TestClient(RedactResponses(pooled.gate(operator=True)))
    headers = {"authorization": f"Bearer {key}"}
    # A wrong-shaped adopt: the reason names the field, never what was in it.
    bad = {**adopt, "custodianCredential": "short-but-secret-value"}
    refused = client.post("/v1/adopt", json=bad, headers=headers)
    assert refused.status_code == 400
    assert "custodianCredential" in refused.json()["reason"]
    assert "short-but-secret-value" not in refused.text
    # The key is spent on that refusal; a fresh pod adopts.
    pooled = PooledCustodian(
        {**env, "CORRAL_STATE_DIR": str(tmp_path / "state2")},
        hashlib.sha256(key.encode()).hexdigest(),
    )
    client = TestClient(RedactResponses(pooled.gate(operator=True)))
    answer = client.post("/v1/adopt", json=adopt, headers=headers)
    assert answer.status_code == 200, answer.text
    values = clean_registry.values()
    assert adopt["wireToken"] in values and adopt["custodianCredential"] in values
    assert MODEL_KEY in values


def test_a_rotated_service_account_token_is_registered_before_it_is_sent(
    tmp_path: Path, clean_registry: SecretRegistry
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("eyJ-first-token-0123456789\n")
    # What the redactor held when each request reached the API server (a stand-in here).
    held_when_sent: list[tuple[str, list[str]]] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        held_when_sent.append((request.headers["Authorization"], clean_registry.values()))
        return web.json_response({"kind": "Session"})

    async def calls() -> None:
        async with ApiServer(handler=answer) as server:
            client = kube_client(KubeSettings(server.url, token_file, None))
            try:
                await client.get("/apis/corral.dev/v1alpha1/namespaces/ns/sessions/s")
                token_file.write_text("eyJ-rotated-token-9876543210\n")  # the kubelet rotated it
                await client.get("/apis/corral.dev/v1alpha1/namespaces/ns/sessions/s")
                token_file.write_text("eyJ-1\n")  # too short to redact: never sent
                with pytest.raises(KubeConfigError, match="at least 8"):
                    await client.get("/apis/corral.dev/v1alpha1/namespaces/ns/sessions/s")
            finally:
                await client.aclose()

    asyncio.run(calls())
    first, rotated = "eyJ-first-token-0123456789", "eyJ-rotated-token-9876543210"
    assert held_when_sent == [(f"Bearer {first}", [first]), (f"Bearer {rotated}", [first, rotated])]
    assert clean_registry.redact(rotated) == "[redacted:service-account-token]"


def test_a_hook_secret_read_for_a_hook_is_registered_and_a_short_one_refused(
    tmp_path: Path, clean_registry: SecretRegistry
) -> None:
    hooks = AgentHooks.model_validate(
        {
            "beforeTool": [
                {
                    "name": "policy",
                    "http": {
                        "url": "http://127.0.0.1:9/hook",
                        "headers": [
                            {"name": "Authorization", "secretKey": "token", "prefix": "Bearer "}
                        ],
                    },
                }
            ]
        }
    )
    hook = hooks.for_phase("beforeTool")[0]
    (tmp_path / "token").write_text("hook-token-rotated-1234\n")
    assert hook_headers(hook, tmp_path)["Authorization"] == "Bearer hook-token-rotated-1234"
    assert clean_registry.values() == ["hook-token-rotated-1234"]
    (tmp_path / "token").write_text("tiny\n")
    with pytest.raises(HookProblem) as refused:
        hook_headers(hook, tmp_path)
    assert refused.value.status == 503 and "'token'" in refused.value.reason
    assert "tiny" not in refused.value.reason
