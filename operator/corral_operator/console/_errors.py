"""How the console answers a refusal or a cluster error: an error page for people (or the
sign-in page when they have not signed in), `{error, reason}` for the JSON API."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException

from corral_kube import Forbidden, KubeError, NotFound

from . import pages
from ._context import ConsoleContext, wants_html
from .access import Refused


def register_error_handlers(app: FastAPI, ctx: ConsoleContext) -> None:
    @app.exception_handler(Refused)
    async def _refused(request: Request, exc: Refused) -> Response:
        if exc.status == 401 and wants_html(request) and ctx.access.needs_login:
            return RedirectResponse("/login", status_code=303)
        body = {"error": exc.error, "reason": exc.reason}
        if wants_html(request):
            return HTMLResponse(pages.error_page(exc.status, exc.error, exc.reason), exc.status)
        return JSONResponse(body, exc.status)

    @app.exception_handler(KubeError)
    async def _kube(request: Request, exc: KubeError) -> Response:
        status = exc.status if isinstance(exc, Forbidden | NotFound) else 503
        error = {403: "forbidden", 404: "not_found"}.get(status, "cluster_unavailable")
        if wants_html(request):
            return HTMLResponse(pages.error_page(status, error, exc.message), status)
        return JSONResponse({"error": error, "reason": exc.message}, status)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        # A path the console does not serve, or a method it does not take: the same answer
        # as any other refusal (a page, or `{error, reason}`), not the framework's own.
        error = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "refused")
        reason = f"{request.method} {request.url.path}: {exc.detail}"
        if wants_html(request):
            return HTMLResponse(pages.error_page(exc.status_code, error, reason), exc.status_code)
        return JSONResponse({"error": error, "reason": reason}, exc.status_code)
