"""The Sessions: the fleet page and a Session's page, and the same reads as JSON. A finished
Session is shown with its archive (docs/history.md), and from it once the object is gone."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

from corral_api.kinds import FINAL_PHASES

from . import pages
from ._context import ConsoleContext, Obj
from .access import Person, Refused


def register_session_routes(app: FastAPI, ctx: ConsoleContext) -> None:
    @app.get("/", response_class=HTMLResponse)
    async def fleet(request: Request) -> str:
        person = await ctx.person_of(request)
        return pages.fleet_page(person.name, await ctx.readable(person, "Session"), 0, time.time())

    @app.get("/ns/{namespace}/sessions/{name}", response_class=HTMLResponse)
    async def session_page(request: Request, namespace: str, name: str) -> str:
        person = await ctx.person_of(request)
        view = await session_view(ctx, person, namespace, name)
        return pages.session_page(
            person.name,
            view["session"],
            view["children"],
            view["approvals"],
            view["mayDecide"],
            time.time(),
            archive=view.get("archive"),
        )

    @app.get("/api/v1/sessions")
    async def sessions(request: Request) -> Obj:
        person = await ctx.person_of(request)
        found = await ctx.readable(person, "Session")
        return {"items": [s for ns in sorted(found) for s in found[ns]]}

    @app.get("/api/v1/namespaces/{namespace}/sessions/{name}")
    async def session_json(request: Request, namespace: str, name: str) -> Obj:
        person = await ctx.person_of(request)
        view = await session_view(ctx, person, namespace, name)
        st = view["session"].get("status") or {}
        ns_deciders = {namespace} if view["mayDecide"] else set()
        # The page's live parts, rendered as the page renders them, for the script to swap in.
        view["fragments"] = {
            "phase": pages._phase(st.get("phase")),
            "turns": str(int(st.get("turns") or 0)),
            "tokens": str(pages.tokens(st)),
            "cost": pages.cost(st),
            "message": pages.esc(st.get("message")),
            "answer": pages.esc(st.get("answer")),
            "approvals": pages.approval_rows(view["approvals"], ns_deciders, time.time()),
            "plan": pages.plan_html(st.get("plan")),
            "receipt": pages.receipt_html(st.get("lastTurn")),
            "conditions": pages.conditions_html(st.get("conditions") or []),
            "receipts": pages.receipts_html(view.get("archive")),
        }
        return view


async def session_view(ctx: ConsoleContext, person: Person, namespace: str, name: str) -> Obj:
    """A Session with its children, its Approvals (if the person may list them), whether the
    person may decide them, and its archive's summary once it has finished."""
    await ctx.require(person, "get", "sessions", namespace)
    session = await ctx.reader.get("Session", namespace, name)
    archive = None
    if session is None or _finished(session):
        uid = None if session is None else session["metadata"].get("uid")
        archived = await _archived_or_refuse(ctx, namespace, name, uid)
        if archived is not None:
            archive = archive_summary(archived.record)
            # The Session object went with its TTL: the record keeps it as it ended.
            session = session or archived.session
    if session is None:
        raise Refused(404, "not_found", f"session {name} not found in {namespace}")
    siblings = await ctx.reader.objects("Session", namespace)
    children = [
        s for s in siblings
        if ((s.get("spec") or {}).get("parentRef") or {}).get("name") == name
    ]  # fmt: skip
    approvals: list[Obj] = []
    if await ctx.may(person, "list", "approvals", namespace):
        approvals = [
            a for a in await ctx.reader.objects("Approval", namespace)
            if ((a.get("spec") or {}).get("sessionRef") or {}).get("name") == name
        ]  # fmt: skip
    may_decide = await ctx.may(person, "update", "approvals", namespace, "status")
    return {
        "session": session,
        "children": children,
        "approvals": approvals,
        "mayDecide": may_decide,
        "archive": archive,
    }


async def _archived_or_refuse(
    ctx: ConsoleContext, namespace: str, name: str, uid: str | None
) -> Any:
    try:
        return await ctx.reader.archived(namespace, name, uid)
    except OSError as err:  # the volume or the object store: say so, as the reader does
        why = f"the archive cannot be read: {err}"
        raise Refused(503, "archive_unavailable", why) from None


def _finished(session: Obj) -> bool:
    return ((session.get("status") or {}).get("phase") or "") in FINAL_PHASES


def archive_summary(record: Obj) -> Obj:
    """What a page shows of an archive: when and why it was written, and the receipts."""
    return {
        "archivedAt": record.get("archivedAt"),
        "cause": record.get("cause"),
        "events": record.get("events"),
        "receipts": list(record.get("receipts") or []),
    }
