"""The custodian's policies hold the same for every provider (docs/providers.md, issue 25).

Real custodian processes, as in a pod: each reads its Session, its Agent and the Freezes of its
namespace from a stand-in API server (with the sandbox's token), and sends model requests to
its provider's stand-in on loopback (the Messages API itself, a gateway, Amazon Bedrock, Google
Vertex AI, from `corral_dev.providers`), with one Messages API behind each. Every request a
provider's endpoint is sent is recorded as it arrives, before the stand-in checks it, so
"nothing was sent" and "it arrived clamped" are read where the provider reads them: for
Bedrock and Vertex, in the custodian's translated body. Per provider:

- The model allowlist: a model the Agent does not name (one the catalog gives a Bedrock and a
  Vertex id, so only the allowlist stands in its way) is refused 403 `permission_error`,
  naming the models allowed, and the provider is sent nothing; the Agent's model, through the
  same custodian, arrives.
- The clamp: `max_tokens` over the Agent's `limits.maxOutputTokens` arrives at that limit, the
  thinking budget lowered under it; a `max_tokens` under the limit arrives as asked.
- Freezes: the custodian of a Session a Freeze holds refuses the model call 403
  `session_frozen_error` (not retried), naming the Freeze and its reason, and the provider is
  sent nothing, not even a token grant; once the Freeze is lifted (`frozen: false`) the same
  custodian sends the same request.
- Budgets: `test_provider_conformance.py::test_the_budget_is_enforced_from_the_providers_usage`.
- Approvals are not proved here because they do not apply to model requests: an Approval gates
  a tool call (the harness policy's `ask`, the custodian's `request_approval`, and `land`,
  which checks its own; docs/approvals.md), and the custodian's model route
  (`corral_custodian._proxy.ModelProxy.messages`: headers, body, session, freeze, allowlist,
  clamp, concurrency, budget) consults no Approval, whatever the provider.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as Endpoint
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral_api import corral_path
from corral_api.freeze import FROZEN_ERROR
from corral_api.kinds import Freeze
from corral_dev.providers._bedrock import ANTHROPIC_VERSION as BEDROCK_VERSION
from corral_dev.providers._bedrock import BedrockStandIn
from corral_dev.providers._gateway import GatewayStandIn
from corral_dev.providers._vertex import VERTEX_VERSION, VertexStandIn, make_service_account
from corral_dev.providers._vertex import serve_in_thread as serve_app
from tests._objects import NAMESPACE, agent_body, session_body
from tests.unit.custodian._custodian_proc import Custodian, running_custodian
from tests.wire.test_provider_conformance import (
    GATEWAY_KEY,
    PROVIDERS,
    Upstream,
    _provider_env,
    answer,
)

pytestmark = pytest.mark.timeout(60)

MODEL = "corral-scripted"  # the Agent's model
OUTSIDE = "claude-sonnet-4-5"  # in the catalog with a Bedrock and a Vertex id, not the Agent's
CLAMP = 1500  # the Agent's limits.maxOutputTokens, far under the catalog's maximum for MODEL
REASON = "incident 42"
ANSWER = "the answer from behind the provider"


# ------------------------------------------------------------------------ what arrives where


@dataclass
class Seen:
    method: str
    path: str
    body: bytearray = field(default_factory=bytearray)

    def json(self) -> Any:
        return json.loads(self.body)


class Recorded:
    """An ASGI app in front of a stand-in that records every request it is sent, as it
    arrives (before the stand-in checks anything)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.requests: list[Seen] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        seen = Seen(scope["method"], scope["path"])
        self.requests.append(seen)

        async def recording() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen.body += message.get("body", b"")
            return message

        await self.app(scope, recording, send)


class ApiServer:
    """The API server as the custodian reads it: its Session, its Agent and the Freezes of its
    namespace, for the sandbox's token alone."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.objects: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.app = Starlette(routes=[Endpoint("/{path:path}", self._get, methods=["GET"])])

    def put(self, plural: str, body: dict[str, Any]) -> None:
        with self._lock:
            self.objects[corral_path(NAMESPACE, plural, body["metadata"]["name"])] = body

    def set_frozen(self, name: str, frozen: bool) -> None:
        with self._lock:
            self.objects[corral_path(NAMESPACE, "freezes", name)]["spec"]["frozen"] = frozen

    async def _get(self, request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        path = request.url.path
        with self._lock:
            if path == corral_path(NAMESPACE, "freezes"):
                items = [o for p, o in self.objects.items() if p.startswith(path + "/")]
                return JSONResponse({"kind": "FreezeList", "items": items})
            found = self.objects.get(path)
            if found is not None:
                return JSONResponse(found)
        return _status(404, "NotFound", f"{path} not found")


def _status(code: int, reason: str, message: str) -> Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message}  # fmt: skip
    return JSONResponse(body, status_code=code)


# ------------------------------------------------------------------------------- the routes


@dataclass
class Route:
    """One provider: its endpoint, and two custodians in front of it that differ only in
    their Session, `open-<provider>` and `frozen-<provider>` (which a Freeze holds)."""

    name: str
    upstream: Upstream  # the Messages API at the end of every path
    endpoint: Recorded | None  # the provider's stand-in; None: the provider is `upstream`
    open: Custodian
    frozen: Custodian

    def reset(self) -> None:
        self.upstream.load(answer(ANSWER))
        if self.endpoint is not None:
            self.endpoint.requests.clear()

    def sent(self) -> list[Seen | dict[str, Any]]:
        """Everything the provider's endpoint was sent (the token endpoint's grants too)."""
        if self.endpoint is None:
            return list(self.upstream.bodies)
        return list(self.endpoint.requests)

    def model_bodies(self) -> list[dict[str, Any]]:
        """The model requests' bodies as the provider received them: for Bedrock and Vertex,
        the custodian's translation."""
        if self.endpoint is None:
            return list(self.upstream.bodies)
        return [r.json() for r in self.endpoint.requests if r.method == "POST" and (
            r.path.startswith("/model/") or r.path.endswith(":streamRawPredict")
            or r.path == "/v1/messages")]  # fmt: skip


def _endpoint(
    stack: ExitStack, tmp: Path, name: str, upstream: Upstream
) -> tuple[Recorded | None, dict[str, str]]:
    """The provider's stand-in, served behind a recorder, and the custodian's environment."""
    if name == "anthropic":
        return None, {"CORRAL_UPSTREAM_URL": upstream.url}
    if name == "gateway":
        gateway = GatewayStandIn(upstream.url, key=GATEWAY_KEY)
        recorded = Recorded(gateway.app)
        running = serve_app(recorded, name="gateway-standin")
        stack.callback(running.stop)
        entry = {"name": "gw", "type": "gateway", "baseUrl": running.url,
                 "authHeader": "authorization", "authScheme": "Bearer"}  # fmt: skip
        return recorded, _provider_env(entry) | {"ANTHROPIC_API_KEY": GATEWAY_KEY}
    if name == "bedrock":
        bedrock = BedrockStandIn(upstream=upstream.url, region="us-east-1")
        recorded = Recorded(bedrock.app)
        running = serve_app(recorded, name="bedrock-standin")
        stack.callback(running.stop)
        entry = {"name": "bedrock", "type": "bedrock", "region": "us-east-1",
                 "endpointUrl": running.url}  # fmt: skip
        return recorded, _provider_env(entry) | {
            "AWS_ACCESS_KEY_ID": bedrock.access_key_id,
            "AWS_SECRET_ACCESS_KEY": bedrock.secret_access_key,
        }
    account = make_service_account()
    vertex = VertexStandIn(upstream.url, account=account)
    recorded = Recorded(vertex.app)
    running = serve_app(recorded, name="vertex-standin")
    vertex.url = running.url  # the JWT grant's audience
    stack.callback(running.stop)
    key_file = tmp / "vertex-key.json"
    key_file.write_text(account.json())
    entry = {"name": "vertex", "type": "vertex", "project": vertex.project,
             "region": vertex.region, "endpointUrl": running.url,
             "tokenUrl": vertex.token_url}  # fmt: skip
    return recorded, _provider_env(entry) | {"CORRAL_GCP_KEY_FILE": str(key_file)}


def _enter_all(
    stack: ExitStack, managers: list[AbstractContextManager[Custodian]]
) -> list[Custodian]:
    """Start every custodian at once (each waits for its own readiness) and stop them at once
    with `stack`, those that started even when another did not."""
    with ThreadPoolExecutor(max_workers=len(managers)) as pool:
        futures = [pool.submit(m.__enter__) for m in managers]
    entered = [m for m, f in zip(managers, futures, strict=True) if f.exception() is None]

    def stop_all() -> None:
        with ThreadPoolExecutor(max_workers=len(managers)) as pool:
            list(pool.map(lambda m: m.__exit__(None, None, None), entered))

    stack.callback(stop_all)
    for future in futures:
        if (problem := future.exception()) is not None:
            raise problem
    return [f.result() for f in futures]


@dataclass
class Rig:
    api: ApiServer
    routes: dict[str, Route]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("policies")
    token = secrets.token_urlsafe(32)
    (tmp / "sa-token").write_text(token)
    api = ApiServer(token)
    api.put("agents", agent_body("coder", identity="You are a test agent.", model=MODEL,
                                 limits={"maxOutputTokens": CLAMP}))  # fmt: skip
    with ExitStack() as stack:
        running_api = serve_app(api.app, name="api-standin")
        stack.callback(running_api.stop)
        managers: list[AbstractContextManager[Custodian]] = []
        endpoints: dict[str, tuple[Upstream, Recorded | None]] = {}
        for name in PROVIDERS:
            upstream = Upstream()
            stack.callback(upstream.close)
            recorded, env = _endpoint(stack, tmp, name, upstream)
            endpoints[name] = upstream, recorded
            for session in (f"open-{name}", f"frozen-{name}"):
                uid = f"uid-{session}"
                api.put("sessions", session_body(session, uid=uid))
                cluster = {
                    "CORRAL_KUBE_API": running_api.url,
                    "CORRAL_KUBE_TOKEN_FILE": str(tmp / "sa-token"),
                    "CORRAL_SESSION_NAME": session,
                    "CORRAL_SESSION_NAMESPACE": NAMESPACE,
                    "CORRAL_SESSION_UID": uid,
                }
                managers.append(
                    running_custodian(cluster | env, tmp / f"{session}.log", operator=False)
                )
            freeze = Freeze.model_validate({
                "metadata": {"name": f"session-frozen-{name}", "namespace": NAMESPACE},
                "spec": {"scope": {"session": f"frozen-{name}"}, "reason": REASON},
            })  # fmt: skip
            api.put("freezes", freeze.wire())
        custodians = iter(_enter_all(stack, managers))
        routes = {}
        for name, (upstream, recorded) in endpoints.items():
            open_, frozen = next(custodians), next(custodians)
            routes[name] = Route(name, upstream, recorded, open_, frozen)
        yield Rig(api, routes)


@pytest.fixture(params=PROVIDERS)
def route(request: pytest.FixtureRequest, rig: Rig) -> Route:
    return rig.routes[request.param]


def ask(
    custodian: Custodian, model: str = MODEL, max_tokens: int = 100, **extra: Any
) -> httpx.Response:
    """One model request as the harness makes it (streamed), read to its end."""
    body = {"model": model, "max_tokens": max_tokens, "stream": True,
            "messages": [{"role": "user", "content": "hello"}], **extra}  # fmt: skip
    headers = {**custodian.headers, "anthropic-version": "2023-06-01"}
    return httpx.post(custodian.url + "/v1/messages", json=body, headers=headers, timeout=30)


def refusal_of(response: httpx.Response) -> tuple[str, str, str | None]:
    """A 403 refusal's error type, message and whether the SDK may retry it."""
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    return error["type"], error["message"], response.headers.get("x-should-retry")


def assert_went_through(route: Route, response: httpx.Response) -> None:
    """The answer came back from the far end, and the provider was sent one model request."""
    assert response.status_code == 200, response.text
    assert ANSWER in response.text  # the upstream's answer, back through the provider
    assert len(route.model_bodies()) == 1
    assert [b["model"] for b in route.upstream.bodies] == [MODEL]


# -------------------------------------------------------------------------------- the tests


def test_a_model_outside_the_allowlist_is_refused_and_nothing_is_sent(route: Route) -> None:
    route.reset()
    refused = ask(route.open, model=OUTSIDE)
    kind, message, retry = refusal_of(refused)
    assert (kind, retry) == ("permission_error", "false"), refused.text
    assert f"model {OUTSIDE!r} is not allowed for this session; allowed: {MODEL!r}" in message
    assert route.sent() == [] and route.upstream.bodies == []

    route.reset()  # the same custodian sends the Agent's own model: the route is open
    assert_went_through(route, ask(route.open))


def test_max_tokens_over_the_clamp_reaches_the_provider_clamped(route: Route) -> None:
    route.reset()
    thinking = {"type": "enabled", "budget_tokens": 16000}
    assert_went_through(route, ask(route.open, max_tokens=20000, thinking=thinking))
    [received] = route.model_bodies()
    assert received["max_tokens"] == CLAMP
    assert received["thinking"] == {"type": "enabled", "budget_tokens": CLAMP - 1}
    assert route.upstream.bodies[0]["max_tokens"] == CLAMP
    if route.name == "bedrock":  # the translated body: the URL names the model
        assert received["anthropic_version"] == BEDROCK_VERSION and "model" not in received
    elif route.name == "vertex":
        assert received["anthropic_version"] == VERTEX_VERSION and "model" not in received
    else:
        assert received["model"] == MODEL

    route.reset()  # under the limit: as asked
    assert_went_through(route, ask(route.open, max_tokens=CLAMP - 600))
    assert [b["max_tokens"] for b in route.model_bodies()] == [CLAMP - 600]


def test_a_frozen_session_calls_no_provider_until_the_freeze_is_lifted(
    route: Route, rig: Rig
) -> None:
    route.reset()
    refused = ask(route.frozen)
    kind, message, retry = refusal_of(refused)
    assert (kind, retry) == (FROZEN_ERROR, "false"), refused.text
    freeze = f"session-frozen-{route.name}"
    assert f"frozen by Freeze {freeze} (session frozen-{route.name}): {REASON}" in message
    assert route.sent() == [] and route.upstream.bodies == []

    rig.api.set_frozen(freeze, False)  # lifted: the custodian reads it within its 1 s cache
    try:
        deadline = time.monotonic() + 10
        while (answered := ask(route.frozen)).status_code == 403:
            assert refusal_of(answered)[0] == FROZEN_ERROR, answered.text
            assert route.sent() == [], "a refused request reached the provider"
            assert time.monotonic() < deadline, "the lifted freeze still holds"
            time.sleep(0.1)
        assert_went_through(route, answered)
    finally:
        rig.api.set_frozen(freeze, True)
