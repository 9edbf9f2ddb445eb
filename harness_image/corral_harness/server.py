"""The harness's HTTP server: the wire (`corral_api.wire`, docs/architecture.md) on FastAPI.

Auth: when a token file is configured every route but `/readyz` wants `Authorization: Bearer
<token>`. Bad input is a 400 with a reason; an unknown conversation is a 404 on both views.
The engine adapter (CORRAL_ENGINE, see `engine/choice.py`) is loaded once the server listens;
`/readyz` answers 200 only once a turn could start: the engine is loaded and, with
CORRAL_EXEC_SOCKET set (the working tools, /checks and the policy's path checks go to the tools
container's exec service), the exec service answers.

`GET .../log` and `PUT .../log` read a conversation's durable log and restore one from another
harness's (issue 27: a session outlives its pod; `corral_api.wire`, LogRestored).
"""

from __future__ import annotations

import asyncio
import hmac
import io
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral_api.kinds import AgentSpec
from corral_api.wire import (
    BUNDLE_CONTENT_TYPE,
    LOG_CONTENT_TYPE,
    LOG_NEXT_HEADER,
    WIP_BASE_HEADER,
    WIP_REVISION_HEADER,
    WIRE_VERSION,
    WIRE_VERSION_HEADER,
    AbortRequest,
    AdmitRequest,
    EndRequest,
    EndResponse,
    LogRestored,
    SteerRequest,
    SteerResponse,
    WipApplied,
)
from corral_common.catalog import UnknownModel, resolve_model

from . import metrics, wip
from .approvals.custodian_port import CustodianApprovalPort
from .approvals.file_port import FileApprovalPort
from .config import HarnessConfig
from .conversations import Conversation, RecordCheck, Registry, Submission, new_submission_id
from .custodian_client.menu import MenuClient
from .default_policy import DefaultPolicy
from .delivery import BundleError, TurnDelivery
from .engine.choice import engine_loader as chosen_engine_loader
from .engine.seam import EngineAdapter
from .evaluation_probe import CheckRequest, run_check
from .ports import ApprovalPort, TurnContext, TurnPolicy, Workspace, WorkspaceError
from .telemetry import TRACING
from .tools import LocalWorkspace, WorkingTools
from .tools._exec_client import ExecWorkspace
from .turn import Turn, TurnDeps

log = logging.getLogger("corral.harness")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
MAX_WAIT_SECONDS = 60.0
# The largest log a restore takes (the harness has no other request cap to share).
MAX_RESTORE_BYTES = 256 * 1024 * 1024
DEFAULT_IDENTITY = "You are a coding agent working in the repository at your granted root."


def _error(status: int, error: str, reason: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": error, "reason": reason, **extra}, status_code=status)


def _reason(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


class WireVersion:
    """Names the wire's version on every answer, refusals and /readyz included (the operator
    reads nothing of a harness whose version it cannot drive)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.header = (WIRE_VERSION_HEADER.lower().encode(), WIRE_VERSION.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_version(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_version)


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


class _ServerState:
    """What the routes share: the conversations, the workspace, the policy, the engine's load."""

    def __init__(
        self,
        config: HarnessConfig,
        *,
        registry: Registry,
        workspace: Workspace,
        policy: TurnPolicy,
        engine_loader: Callable[[], Awaitable[EngineAdapter]],
        menu: MenuClient,
        delivery: TurnDelivery | None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.workspace = workspace
        self.policy = policy
        self.engine_loader = engine_loader
        self.menu = menu
        self.delivery = delivery
        self.engine_warm: list[asyncio.Future[EngineAdapter]] = []  # the load started at boot
        self.ended: set[tuple[str, str]] = set()  # conversations whose sessionEnd hooks ran

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        self.registry.load()
        # Load the engine as soon as the server listens (the SDK's import goes to a thread and
        # would slow the bind); the first submission awaits the same load, /readyz reports it.
        warm = asyncio.get_running_loop().call_soon(
            lambda: self.engine_warm.append(asyncio.ensure_future(self.engine_loader()))
        )
        TRACING.use_custodian(self.config.custodian_url, self.config.custodian_credential_file)
        if TRACING.wanted():
            # The OTLP exporter's import goes to a thread, off the first request (docs/tracing.md).
            asyncio.get_running_loop().run_in_executor(None, TRACING.configured)
        yield
        warm.cancel()
        TRACING.shutdown()  # flushes the spans still batched
        await self.registry.close()
        await self.menu.close()
        if self.delivery is not None:
            await self.delivery.aclose()
        if isinstance(self.workspace, ExecWorkspace):
            await self.workspace.aclose()

    def lookup(self, agent: str, conversation: str) -> Conversation | JSONResponse:
        """The conversation, else the 400 of a bad name or the 404 of an unknown one."""
        bad = _names_ok(agent, conversation)
        if bad is not None:
            return bad
        conv = self.registry.get(agent, conversation)
        if conv is None:
            return _error(404, "unknown_conversation", f"no conversation {agent}/{conversation}")
        return conv


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
    engine_loader = engine or chosen_engine_loader(config)
    # The workspace: `push` and `land` first hand the custodian the commits as a bundle.
    menu = MenuClient(
        config.custodian_url, credential=config.custodian_credential(), workspace=workspace
    )
    # A read-only session changes nothing, so it commits and delivers nothing.
    delivery: TurnDelivery | None = None
    if not config.read_only:
        credential = config.custodian_credential()
        delivery = TurnDelivery(workspace, config.custodian_url, credential=credential)
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
        delivery=delivery,
    )
    registry = Registry(config.state_dir, Turn(deps), durable=config.durable)
    state = _ServerState(
        config,
        registry=registry,
        workspace=workspace,
        policy=deps.policy,
        engine_loader=engine_loader,
        menu=menu,
        delivery=delivery,
    )

    app = FastAPI(
        title="corral-harness",
        lifespan=state.lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
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
    app.add_middleware(WireVersion)  # outermost: the token's refusals carry it too

    _add_health_routes(app, state)
    _add_conversation_routes(app, state)
    _add_turn_control_routes(app, state)
    _add_log_routes(app, state)
    _add_wip_routes(app, state)
    _add_check_routes(app, state)
    return app


def _names_ok(agent: str, conversation: str) -> JSONResponse | None:
    for label, value in (("agent", agent), ("conversation", conversation)):
        if not NAME.match(value):
            return _error(400, "bad_name", f"{label} name {value!r} must match {NAME.pattern}")
    return None


def _add_health_routes(app: FastAPI, state: _ServerState) -> None:
    """/readyz (open) and /metrics."""
    workspace = state.workspace
    engine_warm = state.engine_warm

    @app.get("/readyz")
    async def readyz() -> Response:
        # A turn cannot start before its engine is loaded...
        if not engine_warm or not engine_warm[0].done():
            return JSONResponse({"ready": False, "reason": "the model engine"}, status_code=503)
        if engine_warm[0].exception() is not None:
            reason = f"the model engine failed to load: {engine_warm[0].exception()}"
            return JSONResponse({"ready": False, "reason": reason}, status_code=503)
        # ...nor before the tools container's exec service answers.
        if isinstance(workspace, ExecWorkspace) and not await workspace.healthy():
            return JSONResponse({"ready": False, "reason": "the exec service"}, status_code=503)
        return JSONResponse({"ready": True})

    @app.get("/metrics")
    async def metrics_() -> Response:
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)


def _add_conversation_routes(app: FastAPI, state: _ServerState) -> None:
    """A submission's admission and the conversation's two views: its updates and history."""
    registry = state.registry

    @app.post("/agents/{agent}/{conversation}")
    async def admit(agent: str, conversation: str, request: Request) -> Response:
        bad = _names_ok(agent, conversation)
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
        conv = conv or registry.create(agent, conversation)
        # A level a steer set holds for the turns after it (a wait keeps its level).
        thinking = body.thinkingLevel or conv.steered_level or spec.thinking_level
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
            output_schema=body.outputSchema,
            run_id=body.runId,
            plan=body.plan,
            decide_then_act=bool(body.decideThenAct),
            replies=list(body.replies or []),
        )
        if body.runId:
            log.info(
                "admitted %s/%s submission %s run %s",
                agent,
                conversation,
                sub.id,
                body.runId,
                extra={"runId": body.runId},
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
        found = state.lookup(agent, conversation)
        if isinstance(found, JSONResponse):
            return found
        if offset < 0 or wait < 0:
            return _error(400, "bad_request", "offset and wait must not be negative")
        events = await found.events_after(offset, min(wait, MAX_WAIT_SECONDS))
        return JSONResponse({"events": events, "offset": offset + len(events)})

    @app.get("/agents/{agent}/{conversation}/history")
    async def history(agent: str, conversation: str) -> Response:
        found = state.lookup(agent, conversation)
        if isinstance(found, JSONResponse):
            return found
        events = await found.events_after(0, 0)
        return JSONResponse({"events": events, "offset": len(events)})


def _add_turn_control_routes(app: FastAPI, state: _ServerState) -> None:
    """What the driver says of turns admitted: abort one, steer one, end the session."""
    registry = state.registry

    @app.post("/agents/{agent}/{conversation}/abort")
    async def abort(agent: str, conversation: str, request: Request) -> Response:
        bad = _names_ok(agent, conversation)
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

    @app.post("/agents/{agent}/{conversation}/steer")
    async def steer(agent: str, conversation: str, request: Request) -> Response:
        """A later message of the turn in flight, and/or a new thinking level (docs/ledger.md)."""
        found = state.lookup(agent, conversation)
        if isinstance(found, JSONResponse):
            return found
        try:
            body = SteerRequest.model_validate(json.loads(await request.body() or b"null"))
        except ValueError as exc:
            reason = _reason(exc) if isinstance(exc, ValidationError) else f"invalid JSON: {exc}"
            return _error(400, "bad_request", reason)
        sub = found.steer(body.message, body.thinkingLevel, body.submissionId)
        if sub is None:
            which = f"submission {body.submissionId}" if body.submissionId else "no turn"
            return _error(409, "no_turn", f"{which} is not running in {agent}/{conversation}")
        return JSONResponse(SteerResponse(steered=True, submissionId=sub.id).model_dump())

    @app.post("/agents/{agent}/{conversation}/end")
    async def end(agent: str, conversation: str, request: Request) -> Response:
        """The session is over (the driver says so once): run the sessionEnd hooks, once."""
        bad = _names_ok(agent, conversation)
        if bad is not None:
            return bad
        try:
            body = EndRequest.model_validate(json.loads(await request.body() or b"{}"))
        except ValueError as exc:
            reason = _reason(exc) if isinstance(exc, ValidationError) else f"invalid JSON: {exc}"
            return _error(400, "bad_request", reason)
        conv = registry.get(agent, conversation)
        spec = body.agent or _previous_agent(conv)
        if conv is None or spec is None or (agent, conversation) in state.ended:
            return JSONResponse(EndResponse(ended=False).model_dump(exclude_none=True))
        state.ended.add((agent, conversation))
        session_end = getattr(state.policy, "session_end", None)
        if session_end is None:
            return JSONResponse(EndResponse(ended=True).model_dump(exclude_none=True))
        ctx = TurnContext(
            conversation=conv.id,
            submission_id="",
            agent=spec,
            model=spec.model,
            thinking_level=spec.thinking_level,
            granted_root=state.workspace.root,
            read_only=state.config.read_only,
            context_window=0,
            max_output_tokens=0,
            memory_scope=conv.agent,
        )
        outcome = await session_end(ctx, phase=body.phase)
        answer = EndResponse(
            ended=True, denied=outcome.denied, reason=outcome.reason if outcome.denied else None
        )
        return JSONResponse(answer.model_dump(exclude_none=True))


def _add_log_routes(app: FastAPI, state: _ServerState) -> None:
    """The durable log read from record N, and a conversation restored from one (issue 27)."""
    registry = state.registry

    @app.get("/agents/{agent}/{conversation}/log")
    async def read_log(
        agent: str, conversation: str, first: int = Query(default=0, alias="from")
    ) -> Response:
        found = state.lookup(agent, conversation)
        if isinstance(found, JSONResponse):
            return found
        await found.durable()  # what is archived is never ahead of this disk
        count = found.log.durable_count()
        if not 0 <= first <= count:
            reason = f"from={first} is outside the log: it holds {count} durable records"
            return _error(400, "bad_request", reason)
        return StreamingResponse(
            found.log.read_from(first, count),
            media_type=LOG_CONTENT_TYPE,
            headers={LOG_NEXT_HEADER: str(count)},
        )

    @app.put("/agents/{agent}/{conversation}/log")
    async def restore_log(agent: str, conversation: str, request: Request) -> Response:
        bad = _names_ok(agent, conversation)
        if bad is not None:
            return bad
        if registry.get(agent, conversation) is not None:
            return _exists(agent, conversation)  # before reading what may be a large body
        body = await _read_capped(request, MAX_RESTORE_BYTES)
        if body is None:
            return _error(413, "too_large", f"the log is larger than {MAX_RESTORE_BYTES} bytes")
        records = _log_records(body)
        if isinstance(records, str):
            return _error(400, "bad_request", records)
        restored = registry.restore(agent, conversation, records)
        if restored is None:
            return _exists(agent, conversation)
        conv, events, interrupted = restored
        await conv.durable()  # an answered restore survives a crash
        answer = LogRestored(
            restored=True, records=len(records), events=events, interrupted=interrupted
        )
        return JSONResponse(answer.model_dump(), status_code=201)


def _add_wip_routes(app: FastAPI, state: _ServerState) -> None:
    """The workspace's work in progress, out of a pod mid-turn and into the next (issue 27)."""

    @app.get("/agents/{agent}/{conversation}/wip")
    async def read_wip(agent: str, conversation: str) -> Response:
        found = state.lookup(agent, conversation)
        if isinstance(found, JSONResponse):
            return found
        try:
            base = await state.delivery.bundle_base(conversation) if state.delivery else None
            shot = await wip.snapshot(state.workspace, base)
        except (wip.WipError, BundleError, WorkspaceError) as exc:
            return _error(503, "wip_unavailable", str(exc))
        if shot is None:
            return Response(status_code=204)
        headers = {WIP_REVISION_HEADER: shot.revision, WIP_BASE_HEADER: shot.base or ""}
        # A bundle that fails half-way breaks the stream off: the operator keeps no partial one.
        return StreamingResponse(
            wip.bundle(state.workspace, shot), media_type=BUNDLE_CONTENT_TYPE, headers=headers
        )

    @app.put("/agents/{agent}/{conversation}/wip")
    async def apply_wip(agent: str, conversation: str, request: Request) -> Response:
        found = state.lookup(agent, conversation)
        if isinstance(found, JSONResponse):
            return found
        revision = request.query_params.get("revision", "")
        base = request.query_params.get("base") or None
        body = await _read_capped(request, wip.BUNDLE_MAX_BYTES)
        if body is None:
            return _error(413, "too_large", f"the bundle is over {wip.BUNDLE_MAX_BYTES} bytes")
        try:
            await wip.apply(state.workspace, body, revision, base)
        except (wip.WipError, WorkspaceError) as exc:
            return _error(422, "wip_not_applied", str(exc))
        return JSONResponse(WipApplied(applied=True, revision=revision).model_dump())


def _exists(agent: str, conversation: str) -> JSONResponse:
    return _error(
        409,
        "conversation_exists",
        f"{agent}/{conversation} is held here already; a conversation is restored once",
    )


async def _read_capped(request: Request, cap: int) -> bytes | None:
    """The request body, or None when it is (or says it is) longer than `cap` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _log_records(body: bytes) -> list[dict[str, Any]] | str:
    """The records of an ndjson log, or why it is not one (naming the line)."""
    check = RecordCheck()
    records: list[dict[str, Any]] = []
    for number, line in enumerate(io.BytesIO(body), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:  # UnicodeDecodeError included
            return f"line {number}: not JSON: {exc}"
        problem = check.problem(record)
        if problem is not None:
            return f"line {number}: {problem}"
        records.append(record)
    if not records:
        return "the body holds no log records (ndjson, one record a line)"
    return records


def _add_check_routes(app: FastAPI, state: _ServerState) -> None:
    """/checks: a check run in the workspace (evaluation_probe.py)."""
    workspace = state.workspace

    @app.post("/checks")
    async def checks(request: Request) -> Response:
        try:
            body = CheckRequest.model_validate(json.loads(await request.body() or b"null"))
        except ValueError as exc:
            reason = _reason(exc) if isinstance(exc, ValidationError) else f"invalid JSON: {exc}"
            return _error(400, "bad_request", reason)
        result = await run_check(workspace, body)
        return JSONResponse(result.model_dump())


def _previous_agent(conv: Conversation | None) -> AgentSpec | None:
    if conv is None or not conv.submissions:
        return None
    return list(conv.submissions.values())[-1].agent
