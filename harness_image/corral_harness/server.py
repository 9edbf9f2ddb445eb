"""The harness's HTTP server: the wire of DESIGN §4 and §8 on FastAPI.

Auth: when a token file is configured every route but `/readyz` wants `Authorization: Bearer
<token>`. Bad input is a 400 with a reason; an unknown conversation is a 404 on both views.
The SDK adapter is imported in the background once the server listens, so `/readyz` is quick.
With CORRAL_EXEC_SOCKET set, the working tools, /checks and the policy's path checks go to the
tools container's exec service, and `/readyz` waits for it.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from corral_api.kinds import AgentSpec
from corral_api.wire import AbortRequest, AdmitRequest
from corral_common.catalog import UnknownModel, resolve_model

from . import metrics
from .checks import CheckRequest, run_check
from .config import HarnessConfig
from .conversations import Conversation, Registry, Submission, new_submission_id
from .custodian_client.approvals import CustodianApprovalPort
from .custodian_client.menu import MenuClient
from .default_policy import DefaultPolicy
from .engine.seam import EngineAdapter
from .local_approvals import FileApprovalPort
from .seams import ApprovalPort, TurnPolicy, Workspace
from .tools import LocalWorkspace, WorkingTools
from .tools._exec_client import ExecWorkspace
from .turn import Turn, TurnDeps

log = logging.getLogger("corral.harness")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
MAX_WAIT_SECONDS = 60.0
DEFAULT_IDENTITY = "You are a coding agent working in the repository at your granted root."


def _error(status: int, error: str, reason: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": error, "reason": reason, **extra}, status_code=status)


def _reason(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


class BearerToken:
    """Every route but /readyz wants `Authorization: Bearer <token>` (a plain ASGI middleware:
    Starlette's BaseHTTPMiddleware costs a task per request on the hot long-poll path)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/readyz":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = _error(401, "unauthorized", "a valid bearer token is required")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def sdk_engine_loader(config: HarnessConfig) -> Callable[[], Awaitable[EngineAdapter]]:
    """Import the SDK adapter once, in a thread, and hand out engines built from config."""
    loaded: asyncio.Future[EngineAdapter] | None = None

    def _import() -> EngineAdapter:
        module = importlib.import_module("corral_harness.engine.anthropic_engine")
        settings = module.EngineSettings(
            base_url=config.model_base_url,
            retries=config.model_retries,
            backoff_seconds=config.retry_backoff_seconds,
            idle_seconds=config.stream_idle_seconds,
            stream_cap_seconds=config.stream_cap_seconds,
            **({"api_key": credential} if (credential := config.custodian_credential()) else {}),
        )
        engine_class = module.AnthropicEngine

        def make() -> Any:
            return engine_class(settings)

        return make

    async def get() -> EngineAdapter:
        nonlocal loaded
        if loaded is None:
            loaded = asyncio.ensure_future(asyncio.to_thread(_import))
        return await loaded

    return get


def _approval_port(config: HarnessConfig) -> ApprovalPort:
    """The custodian in a pod (Approval resources); a local file store without one."""
    if config.custodian_url:
        return CustodianApprovalPort(config.custodian_url, credential=config.custodian_credential())
    return FileApprovalPort(config.state_dir / "approvals")


def workspace_for(config: HarnessConfig) -> Workspace:
    """The tools container's exec service when one is configured, else the harness itself."""
    if config.exec_socket is not None:
        return ExecWorkspace(config.exec_socket, config.granted_root)
    return LocalWorkspace(config.granted_root)


def create_app(
    config: HarnessConfig,
    *,
    policy: TurnPolicy | None = None,
    approvals: ApprovalPort | None = None,
    engine: Callable[[], Awaitable[EngineAdapter]] | None = None,
    workspace: Workspace | None = None,
) -> FastAPI:
    """The harness app. `policy`, `approvals`, `engine` and `workspace` replace the defaults
    when given (a policy should be given the same workspace)."""
    workspace = workspace or workspace_for(config)
    token = config.token_file.read_text().strip() if config.token_file else None
    if config.token_file and not token:
        raise ValueError(f"the wire token file {config.token_file} is empty")
    engine_loader = engine or sdk_engine_loader(config)
    menu = MenuClient(config.custodian_url, credential=config.custodian_credential())
    deps = TurnDeps(
        policy=policy or DefaultPolicy(),
        approvals=approvals or _approval_port(config),
        tools=WorkingTools(
            workspace, read_only=config.read_only, bash_timeout=config.bash_timeout_seconds
        ),
        menu=menu,
        engine=engine_loader,
        granted_root=workspace.root,
        read_only=config.read_only,
        pick_sweep_seconds=config.pick_sweep_seconds,
        records_dir=config.state_dir / "turns",
    )
    registry = Registry(config.state_dir, Turn(deps), durable=config.durable)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        config.state_dir.mkdir(parents=True, exist_ok=True)
        registry.load()
        # Warm the SDK adapter off the event loop; the first submission awaits it if needed.
        warm = asyncio.get_running_loop().call_later(
            0.05, lambda: asyncio.ensure_future(engine_loader())
        )
        yield
        warm.cancel()
        await registry.close()
        await menu.close()
        if isinstance(workspace, ExecWorkspace):
            await workspace.aclose()

    app = FastAPI(
        title="corral-harness", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.registry = registry

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI answers 422 by default; the wire's contract is a 400 with a reason.
        parts = [
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()[:5]
        ]
        return _error(400, "bad_request", "; ".join(parts))

    if token is not None:
        app.add_middleware(BearerToken, token=token)

    @app.get("/readyz")
    async def readyz() -> Response:
        # A turn cannot start before the tools container's exec service answers.
        if isinstance(workspace, ExecWorkspace) and not await workspace.healthy():
            return JSONResponse({"ready": False, "reason": "the exec service"}, status_code=503)
        return JSONResponse({"ready": True})

    @app.get("/metrics")
    async def metrics_() -> Response:
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    def names_ok(agent: str, conversation: str) -> JSONResponse | None:
        for label, value in (("agent", agent), ("conversation", conversation)):
            if not NAME.match(value):
                return _error(400, "bad_name", f"{label} name {value!r} must match {NAME.pattern}")
        return None

    def lookup(agent: str, conversation: str) -> Conversation | JSONResponse:
        bad = names_ok(agent, conversation)
        if bad is not None:
            return bad
        conv = registry.get(agent, conversation)
        if conv is None:
            return _error(404, "unknown_conversation", f"no conversation {agent}/{conversation}")
        return conv

    @app.post("/agents/{agent}/{conversation}")
    async def admit(agent: str, conversation: str, request: Request) -> Response:
        bad = names_ok(agent, conversation)
        if bad is not None:
            return bad
        try:
            body = AdmitRequest.model_validate(json.loads(await request.body() or b"null"))
        except ValueError as exc:
            reason = _reason(exc) if isinstance(exc, ValidationError) else f"invalid JSON: {exc}"
            return _error(400, "bad_request", reason)
        conv = registry.get(agent, conversation)
        if body.kept and conv is None:
            return _error(
                404,
                "unknown_conversation",
                f"kept: no conversation {agent}/{conversation} is kept here",
                kept=False,
            )
        spec = (
            body.agent
            or _previous_agent(conv)
            or AgentSpec(identity=DEFAULT_IDENTITY, model=body.model or "corral-scripted")
        )
        model = body.model or spec.model
        try:
            resolve_model(model)
        except UnknownModel as exc:
            return _error(400, "unknown_model", str(exc))
        thinking = body.thinkingLevel or spec.thinking_level
        conv = conv or registry.create(agent, conversation)
        again = conv.by_key.get(body.idempotencyKey) if body.idempotencyKey else None
        if again is not None:
            # The caller lost our answer (say, its ledger write failed): the same submission.
            return JSONResponse(
                {
                    "streamUrl": f"/agents/{agent}/{conversation}/updates",
                    "offset": again.admitted_offset,
                    "submissionId": again.id,
                }
            )
        sub = Submission(
            new_submission_id(),
            body.message,
            model,
            thinking,
            spec,
            body.turn,
            idempotency_key=body.idempotencyKey,
        )
        offset = conv.admit(sub)
        await conv.durable()  # an answered admission survives a crash
        return JSONResponse(
            {
                "streamUrl": f"/agents/{agent}/{conversation}/updates",
                "offset": offset,
                "submissionId": sub.id,
            }
        )

    @app.get("/agents/{agent}/{conversation}/updates")
    async def updates(agent: str, conversation: str, offset: int = 0, wait: float = 0) -> Response:
        found = lookup(agent, conversation)
        if isinstance(found, JSONResponse):
            return found
        if offset < 0 or wait < 0:
            return _error(400, "bad_request", "offset and wait must not be negative")
        events = await found.events_after(offset, min(wait, MAX_WAIT_SECONDS))
        return JSONResponse({"events": events, "offset": offset + len(events)})

    @app.get("/agents/{agent}/{conversation}/history")
    async def history(agent: str, conversation: str) -> Response:
        found = lookup(agent, conversation)
        if isinstance(found, JSONResponse):
            return found
        events = await found.events_after(0, 0)
        return JSONResponse({"events": events, "offset": len(events)})

    @app.post("/agents/{agent}/{conversation}/abort")
    async def abort(agent: str, conversation: str, request: Request) -> Response:
        bad = names_ok(agent, conversation)
        if bad is not None:
            return bad
        conv = registry.get(agent, conversation)
        if conv is None:
            return JSONResponse({"aborted": False})
        # Any body that does not parse counts as "no cause": the sweep settles `aborted`.
        cause: str | None = None
        submission_id: str | None = None
        try:
            parsed = AbortRequest.model_validate(json.loads(await request.body() or b"{}"))
            cause, submission_id = parsed.cause, parsed.submissionId
        except ValueError:
            pass
        return JSONResponse({"aborted": await conv.abort(cause, submission_id)})

    @app.post("/checks")
    async def checks(request: Request) -> Response:
        try:
            body = CheckRequest.model_validate(json.loads(await request.body() or b"null"))
        except ValueError as exc:
            reason = _reason(exc) if isinstance(exc, ValidationError) else f"invalid JSON: {exc}"
            return _error(400, "bad_request", reason)
        result = await run_check(workspace, body)
        return JSONResponse(result.model_dump())

    return app


def _previous_agent(conv: Conversation | None) -> AgentSpec | None:
    if conv is None or not conv.submissions:
        return None
    return list(conv.submissions.values())[-1].agent
