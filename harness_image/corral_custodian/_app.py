"""The custodian's two HTTP surfaces (FastAPI), over one shared core.

Harness-facing (`CORRAL_CUSTODIAN_ADDR`), every path but /readyz behind the pod-local
credential:

    GET  /readyz                                   health, open
    POST /v1/messages                              the model proxy
    GET  /agents/{conversation}/surface            this turn's Menu
    POST /agents/{conversation}/tools/{name}       invoke a Menu tool
    GET  /approvals/{name}                         one of this session's Approvals' decision
    GET  /agents/{conversation}/bundle-base        the base the next bundle starts from
    POST /agents/{conversation}/bundle?revision=   the agent's commits as a git bundle (_git.py)
    POST /agents/{conversation}/deliver            push the turn's commit (_delivery.py)
    POST /agents/{conversation}/hooks/{phase}/{name}   post one of the Agent's http hooks
    POST /memory/recall, /memory/extract           long-term memory (_memory.py)
    POST /otlp/v1/traces                           the harness's traces, to the collector (_otlp.py)

Operator-facing (`CORRAL_CUSTODIAN_OPERATOR_ADDR`), behind the Session's wire token:

    GET  /v1/usage                                 corral_api.wire.CustodianUsage
    GET  /v1/delivery                              corral_api.wire.CustodianDelivery
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from corral_api.wire import (
    BUNDLE_CONTENT_TYPE,
    BundleAccepted,
    CustodianBudget,
    CustodianDelivery,
    CustodianUsage,
    DeliverRequest,
    WireUsage,
)
from corral_common import logs
from corral_common.approval_files import ApprovalFiles
from corral_common.session_files import SessionFiles
from corral_kube import KubeError

from . import rules
from ._auth import RequireCredential
from ._bundle import BundleRefused, write_capped
from ._delivery import BaseUnavailable, Deliveries, with_remote_head
from ._git import GitPusher
from ._hooks import add_hook_routes
from ._kube import kube_client
from ._live import LiveError, LiveState
from ._memory import MEMORY_TOOLS, MemoryService, memory_router
from ._otlp import add_otlp_routes
from ._proxy import BodyTooLarge, ModelProxy, read_capped
from ._tools import ControlTools, ToolFailure
from ._usage_store import UsageStore
from .budget import budget_refusal
from .menu import menu
from .settings import CustodianSettings

log = logging.getLogger("corral_custodian")

# Sent by the harness's approval port alone: its policy's `ask` outcome, not a model's call.
APPROVAL_GATE_HEADER = "x-corral-approval-gate"
RUN_ID_HEADER = "x-corral-run-id"  # the run id the harness's traces carry
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
# A refused bundle's status: its size, else what it holds (the sender's fault), else ours.
_BUNDLE_STATUS = {
    "bundle_too_large": 413, "object_too_large": 413, "timeout": 504, "git_failed": 500,
}  # fmt: skip


def _problem(status: int, error: str, reason: str) -> JSONResponse:
    return JSONResponse({"error": error, "reason": reason}, status_code=status)


def _tool_problem(status: int, error: str, reason: str) -> JSONResponse:
    """A 4xx that still reads as a tool result, so the model sees the reason too."""
    body = {"error": error, "reason": reason, "content": reason, "isError": True, "endsTurn": False}
    return JSONResponse(body, status_code=status)


class Custodian:
    """What both listeners share: the spending record, the live session view, the tools."""

    def __init__(self, settings: CustodianSettings) -> None:
        self.settings = settings
        self.usage = UsageStore(settings.state_dir, settings.usage_seed, settings.carved_seed)
        self.kube = kube_client(settings.kube) if settings.kube is not None else None
        self.live = LiveState(settings, self.kube)
        self.proxy = ModelProxy(settings, self.live, self.usage)
        # The mirror lives where only the custodian writes; the agent's commits arrive as
        # bundles (`POST .../bundle`): the custodian never opens the workspace.
        root = settings.state_dir or Path(tempfile.mkdtemp(prefix="corral-custodian-"))
        pusher = GitPusher(
            root / "custodian-push.git",
            settings.git_remote_url,
            settings.git_credentials_file,
            session_branch=settings.session_branch,
            max_bundle_bytes=settings.max_bundle_bytes,
            max_blob_bytes=settings.max_blob_bytes,
        )
        self.pusher = pusher
        pusher.clear_incoming()
        refused = pusher.remote_refusal()
        if refused is not None:
            log.warning("push and land will be refused: %s", refused)
        # No cluster (`corral run`): the gate's approvals are files beside the custodian's state.
        local_approvals = (
            ApprovalFiles(settings.state_dir / "approvals")
            if self.kube is None and settings.state_dir is not None
            else None
        )
        self.deliveries = Deliveries(pusher, settings.session_branch, settings.state_dir)
        # No cluster, but `corral run`'s session tree: children are created and read there.
        session_files = (
            SessionFiles(settings.local_sessions_dir)
            if self.kube is None and settings.local_sessions_dir is not None
            else None
        )
        self.tools = ControlTools(
            self.live, self.kube, pusher, self.usage, local_approvals, self.deliveries,
            session_files,
        )  # fmt: skip
        self.memory = MemoryService(settings, self.live)

    async def aclose(self) -> None:
        await self.proxy.aclose()
        await self.memory.aclose()
        if self.kube is not None:
            await self.kube.aclose()

    async def usage_report(self) -> CustodianUsage:
        budget = self.settings.budget
        try:
            budget = (await self.live.load()).facts.budget
        except LiveError as e:
            log.warning("usage report with the Session's cap only: %s", e)
        totals = self.usage.totals
        reserved = self.usage.reserved_usage()
        held = self.usage.reserved
        carved = self.usage.carved
        refusal = budget_refusal(totals, budget, carved)
        return CustodianUsage(
            usage=WireUsage(
                input=totals.input,
                output=totals.output,
                cacheRead=totals.cache_read,
                cacheWrite=totals.cache_write,
                cost=totals.cost,
            ),
            reserved=WireUsage(input=reserved.input, output=reserved.output, cost=held.cost),
            # A budget given away has no input/output split: its tokens are reported as input.
            carved=WireUsage(input=carved.tokens, cost=carved.cost),
            budget=CustodianBudget(tokens=budget.tokens, costUSD=budget.cost),
            exceeded=refusal is not None,
            reason=refusal,
        )


def create_app(core: Custodian) -> FastAPI:
    """The harness-facing app."""
    settings = core.settings
    app = FastAPI(title="corral-custodian", docs_url=None, redoc_url=None, openapi_url=None)
    _add_model_routes(app, core)
    _add_menu_routes(app, core)
    _add_delivery_routes(app, core)
    _add_approval_routes(app, core)
    app.include_router(memory_router(core.memory, settings.max_body_bytes))
    add_hook_routes(app, core.live, settings)
    add_otlp_routes(app, settings)

    if settings.credential is None:
        log.warning(
            "CORRAL_CUSTODIAN_INSECURE=1 and no CORRAL_CUSTODIAN_CREDENTIAL_FILE: every caller "
            "is served"
        )
        return app
    app.add_middleware(
        RequireCredential,
        secret=settings.credential,
        what="the pod-local credential",
        accept_api_key=True,
        open_paths=frozenset({"/readyz"}),
    )
    return app


def _add_model_routes(app: FastAPI, core: Custodian) -> None:
    """/readyz (open) and the model proxy."""

    @app.get("/readyz")
    async def readyz() -> dict[str, bool]:
        return {"ok": True}

    runs_seen: list[str] = [""]  # the last run id logged (docs/tracing.md)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        run_id = request.headers.get(RUN_ID_HEADER, "")[:128]
        logs.bind(runId=run_id or None)  # this request's task: its lines name the run
        if run_id and run_id != runs_seen[0]:
            runs_seen[0] = run_id  # once per run, not per model call
            log.info("model requests of run %s", run_id)
        return await core.proxy.messages(request)


def _add_menu_routes(app: FastAPI, core: Custodian) -> None:
    """This turn's Menu and a call of one of its tools."""
    settings = core.settings

    @app.get("/agents/{conversation}/surface")
    async def surface(conversation: str) -> Response:
        try:
            loaded = await core.tools.load()
        except (ToolFailure, KubeError) as e:
            return _problem(503, "surface_unavailable", str(e))
        offered = [*menu(loaded.facts), *core.memory.offered(loaded.facts)]
        return JSONResponse({"tools": [t.wire() for t in offered]})

    @app.post("/agents/{conversation}/tools/{name}")
    async def invoke(conversation: str, name: str, request: Request) -> Response:
        try:
            raw = await read_capped(request, settings.max_body_bytes)
        except BodyTooLarge:
            return _tool_problem(413, "too_large", "the tool input is too large")
        try:
            tool_input = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return _tool_problem(400, "bad_input", "the tool input is not JSON")
        if not isinstance(tool_input, dict):
            return _tool_problem(400, "bad_input", "the tool input must be a JSON object")
        submission = request.headers.get("x-corral-submission", "")
        gate = request.headers.get(APPROVAL_GATE_HEADER, "") == "1"
        if name in MEMORY_TOOLS:
            return JSONResponse((await core.memory.invoke(name, tool_input, submission)).wire())
        try:
            result = await core.tools.invoke(
                name, tool_input, submission, gate=gate, conversation=conversation
            )
        except KeyError:
            return _tool_problem(404, "unknown_tool", f"there is no control tool named {name!r}")
        return JSONResponse(result.wire())


def _add_delivery_routes(app: FastAPI, core: Custodian) -> None:
    """The agent's commits on their way out: the bundle's base, the bundle, the delivery."""
    settings = core.settings

    @app.get("/agents/{conversation}/bundle-base")
    async def bundle_base(conversation: str) -> Response:
        try:
            loaded = await core.live.load(fresh=True)
        except LiveError as e:
            return _problem(503, "cluster_unavailable", str(e))
        workspace = (loaded.session.get("spec") or {}).get("workspace") or {}
        try:
            base = await core.deliveries.bundle_base(
                str(workspace.get("ref") or "HEAD"), conversation
            )
        except BaseUnavailable as e:
            log.warning("no bundle base: %s", e.result.message)
            return _problem(502, e.result.reason, e.result.detail)
        return JSONResponse(base.model_dump(mode="json"))

    @app.post("/agents/{conversation}/bundle")
    async def bundle(conversation: str, request: Request) -> Response:
        """The agent's commits as a git bundle, streamed to a file of the custodian's own and
        checked before git reads it (_bundle.py, _git.GitPusher.take_bundle)."""
        revision = request.query_params.get("revision", "")
        if not _FULL_SHA.match(revision):
            return _problem(400, "bad_input", "'revision' must be the tip's full 40-hex id")
        kind = request.headers.get("content-type", BUNDLE_CONTENT_TYPE).split(";")[0].strip()
        if kind != BUNDLE_CONTENT_TYPE:
            return _problem(400, "bad_input", f"the content type must be {BUNDLE_CONTENT_TYPE}")
        cap = settings.max_bundle_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            return _problem(413, "bundle_too_large", f"the bundle is larger than {cap} bytes")
        directory = core.pusher.incoming_dir()
        try:
            path = directory / "upload.bundle"
            try:
                size = await write_capped(request.stream(), path, cap)
            except BundleRefused as e:
                return _problem(413, e.reason, e.detail)
            taken = await core.pusher.take_bundle(path, revision, conversation)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        if not taken.ok:
            log.warning("bundle refused: %s", taken.message)
            status = _BUNDLE_STATUS.get(taken.reason, 400)
            return _problem(status, taken.reason, taken.detail)
        return JSONResponse(BundleAccepted(revision=revision, bytes=size).model_dump(mode="json"))

    @app.post("/agents/{conversation}/deliver")
    async def deliver(conversation: str, request: Request) -> Response:
        try:
            asked = DeliverRequest.model_validate_json(
                await read_capped(request, settings.max_body_bytes) or b"{}"
            )
        except (BodyTooLarge, ValueError) as e:
            return _problem(400, "bad_input", f"not a delivery request: {e}")
        try:
            loaded = await core.live.load(fresh=True)
        except LiveError as e:
            return _problem(503, "cluster_unavailable", str(e))
        workspace = (loaded.session.get("spec") or {}).get("workspace") or {}
        frozen = loaded.frozen_by.describe() if loaded.frozen_by is not None else None
        # As on every push (docs/delivery.md), with a `HEAD` ref resolved on the remote.
        facts = await with_remote_head(loaded.facts, core.pusher)
        protected = rules.branch_refusal(facts)
        record = await core.deliveries.deliver(
            asked, str(workspace.get("ref") or "HEAD"), frozen=frozen, conversation=conversation,
            protected=protected.reason if protected is not None else None,
        )  # fmt: skip
        if record.state == "Failed":
            log.warning("delivery failed: %s", record.message)
        return JSONResponse(record.model_dump(mode="json"))


def _add_approval_routes(app: FastAPI, core: Custodian) -> None:
    """One of this session's Approvals' decision."""

    @app.get("/approvals/{name}")
    async def approval(name: str) -> Response:
        try:
            found = await core.tools.approval_decision(name)
        except (ToolFailure, KubeError) as e:
            return _problem(503, "cluster_unavailable", str(e))
        if found is None:
            return _problem(404, "unknown_approval", f"no approval {name!r} for this session")
        return JSONResponse(found)


def create_operator_app(core: Custodian) -> FastAPI:
    """The operator-facing app: the custodian's usage record, for the wire token only."""
    assert core.settings.wire_token is not None
    app = FastAPI(
        title="corral-custodian-operator", docs_url=None, redoc_url=None, openapi_url=None
    )

    @app.get("/v1/usage")
    async def usage() -> Response:
        report = await core.usage_report()
        return JSONResponse(report.model_dump(mode="json"))

    @app.get("/v1/delivery")
    async def delivery() -> Response:
        report = CustodianDelivery(delivery=core.deliveries.record)
        return JSONResponse(report.model_dump(mode="json"))

    app.add_middleware(
        RequireCredential,
        secret=core.settings.wire_token,
        what="the session's wire token",
        accept_api_key=False,
    )
    return app
