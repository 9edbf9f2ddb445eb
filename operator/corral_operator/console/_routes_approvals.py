"""The Approvals: their page and list, and a person's decision on one, posted from a page's
form or as JSON (docs/approvals.md)."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from corral_api.decisions import DECISIONS

from . import pages
from ._context import ConsoleContext, Obj, form_of, json_object_of, require_same_origin
from .access import Person, Refused

MAX_REASON_CHARS = 4096


def register_approval_routes(app: FastAPI, ctx: ConsoleContext) -> None:
    @app.get("/approvals", response_class=HTMLResponse)
    async def approvals(request: Request) -> str:
        person = await ctx.person_of(request)
        found = await ctx.readable(person, "Approval")
        deciders = {
            ns for ns in found if await ctx.may(person, "update", "approvals", ns, "status")
        }
        items = [a for objs in found.values() for a in objs]
        return pages.approvals_page(
            person.name, items, deciders, time.time(), sign_out=ctx.access.needs_login
        )

    @app.post("/ns/{namespace}/approvals/{name}/decide")
    async def decide_form(request: Request, namespace: str, name: str) -> Response:
        person = await ctx.person_of(request)
        require_same_origin(request)
        form = await form_of(request)
        decision, reason = str(form.get("decision") or ""), str(form.get("reason") or "")
        await decide(ctx, request, person, namespace, name, decision, reason)
        back = request.headers.get("referer") or "/approvals"
        return RedirectResponse(urlsplit(back).path or "/approvals", status_code=303)

    @app.get("/api/v1/approvals")
    async def approvals_json(request: Request) -> Obj:
        person = await ctx.person_of(request)
        found = await ctx.readable(person, "Approval")
        return {"items": [a for ns in sorted(found) for a in found[ns]]}

    @app.post("/api/v1/namespaces/{namespace}/approvals/{name}/decision")
    async def decision_json(request: Request, namespace: str, name: str) -> Obj:
        person = await ctx.person_of(request)
        require_same_origin(request)
        body = await json_object_of(request)
        decision, reason = str(body.get("decision") or ""), str(body.get("reason") or "")
        return await decide(ctx, request, person, namespace, name, decision, reason)


async def decide(
    ctx: ConsoleContext,
    request: Request,
    person: Person,
    namespace: str,
    name: str,
    decision: str,
    reason: str,
) -> Obj:
    require_same_origin(request)
    if decision not in DECISIONS:
        raise Refused(400, "bad_request", f"decision must be one of {', '.join(DECISIONS)}")
    reason = reason.strip()
    if len(reason) > MAX_REASON_CHARS:  # the Approval's status.comment holds this much
        raise Refused(400, "bad_request", f"the reason is over {MAX_REASON_CHARS} characters")
    await ctx.require(person, "update", "approvals", namespace, "status")
    written = await ctx.access.decide(person, namespace, name, decision, reason)
    return {"approval": written}
