"""The custodian's HTTP surface (FastAPI): model proxy, Menu, tools, usage, health."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ._git import GitPusher, origin_url
from ._kube import KubeClient, KubeError
from ._proxy import ModelProxy
from ._tools import ControlTools, ToolFailure
from ._usage_store import UsageStore
from .budget import budget_refusal
from .menu import menu
from .settings import CustodianSettings, SettingsError


def _problem(status: int, error: str, reason: str) -> JSONResponse:
    return JSONResponse({"error": error, "reason": reason}, status_code=status)


def _tool_problem(status: int, error: str, reason: str) -> JSONResponse:
    """A 4xx that still reads as a tool result, so the model sees the reason too."""
    body = {"error": error, "reason": reason, "content": reason, "isError": True, "endsTurn": False}
    return JSONResponse(body, status_code=status)


def create_app(settings: CustodianSettings) -> FastAPI:
    usage = UsageStore(settings.state_dir)
    proxy = ModelProxy(settings.upstream_url, settings.model_key, settings.budget, usage)
    kube = KubeClient(settings.kube) if settings.kube is not None else None
    state: dict[str, ControlTools] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        pusher: GitPusher | None = None
        if settings.workspace is not None:
            # Pinned now, before the agent has run: the workspace's config is the agent's later.
            remote = settings.git_remote_url or await origin_url(settings.workspace)
            if remote is not None:
                mirror_root = settings.state_dir or settings.workspace.parent
                pusher = GitPusher(
                    settings.workspace,
                    mirror_root / "custodian-push.git",
                    remote,
                    settings.git_credentials_file,
                )
        state["tools"] = ControlTools(settings, kube, pusher)
        yield
        await proxy.aclose()
        if kube is not None:
            await kube.aclose()

    app = FastAPI(title="corral-custodian", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.get("/readyz")
    async def readyz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/usage")
    async def get_usage() -> dict[str, Any]:
        return {
            "usage": usage.totals.wire(),
            "budget": settings.budget.wire(),
            "spent": budget_refusal(usage.totals, settings.budget),
        }

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await proxy.messages(request)

    @app.get("/agents/{conversation}/surface")
    async def surface(conversation: str) -> Response:
        try:
            loaded = await state["tools"].load()
        except (ToolFailure, KubeError, SettingsError) as e:
            return _problem(503, "surface_unavailable", str(e))
        return JSONResponse({"tools": [t.wire() for t in menu(loaded.facts)]})

    @app.post("/agents/{conversation}/tools/{name}")
    async def invoke(conversation: str, name: str, request: Request) -> Response:
        raw = await request.body()
        try:
            tool_input = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return _tool_problem(400, "bad_input", "the tool input is not JSON")
        if not isinstance(tool_input, dict):
            return _tool_problem(400, "bad_input", "the tool input must be a JSON object")
        submission = request.headers.get("x-corral-submission", "")
        try:
            result = await state["tools"].invoke(name, tool_input, submission)
        except KeyError:
            return _tool_problem(404, "unknown_tool", f"there is no control tool named {name!r}")
        except SettingsError as e:
            return _tool_problem(503, "agent_spec_unreadable", str(e))
        return JSONResponse(result.wire())

    @app.get("/approvals/{name}")
    async def approval(name: str) -> Response:
        try:
            found = await state["tools"].approval_decision(name)
        except (ToolFailure, KubeError) as e:
            return _problem(503, "cluster_unavailable", str(e))
        if found is None:
            return _problem(404, "unknown_approval", f"no approval {name!r} for this session")
        return JSONResponse(found)

    return app
