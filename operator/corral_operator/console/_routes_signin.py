"""Signing in and out of the console (a token kept in an HttpOnly cookie), and who is signed in."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from . import pages
from ._context import COOKIE, ConsoleContext, Obj, form_of, require_same_origin
from .access import Refused


def register_signin_routes(app: FastAPI, ctx: ConsoleContext) -> None:
    @app.get("/login", response_class=HTMLResponse)
    async def login_form() -> Response:
        if not ctx.access.needs_login:  # `corral console`: the person is whoever runs it
            return RedirectResponse("/", status_code=303)
        return HTMLResponse(pages.login_page())

    @app.post("/login")
    async def login(request: Request) -> Response:
        if not ctx.access.needs_login:
            return RedirectResponse("/", status_code=303)
        form = await form_of(request)
        token = str(form.get("token") or "").strip()
        require_same_origin(request)
        try:
            await ctx.access.authenticate(token)
        except Refused as exc:
            return HTMLResponse(pages.login_page(exc.reason), exc.status)
        response = RedirectResponse("/", status_code=303)
        # HttpOnly: no script reads it; Strict: no other site's page sends it.
        response.set_cookie(
            COOKIE, token, httponly=True, samesite="strict", secure=ctx.secure_cookie, path="/"
        )
        return response

    @app.post("/logout")
    async def logout() -> Response:
        response = RedirectResponse("/login" if ctx.access.needs_login else "/", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @app.get("/api/v1/whoami")
    async def whoami(request: Request) -> Obj:
        person = await ctx.person_of(request)
        return {"username": person.name, "groups": list(person.groups)}
