"""The Sessions: the fleet page and a Session's page, and the same reads as JSON. A finished
Session is shown with its archive (docs/history.md), and from it once the object is gone; its
delivered work (the Changes) is read from git (`changes.py`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from corral_api.kinds import FINAL_PHASES

from . import pages
from ._context import ConsoleContext, Obj, form_of, json_object_of, require_same_origin
from .access import Person, Refused

# A page waits this long for the Changes; past it the page says they are being read and its
# script fetches them (the read goes on and its answer is kept).
PAGE_CHANGES_SECONDS = 3.0
_READING: set[asyncio.Task[Obj | None]] = set()  # reads a page stopped waiting for


def register_session_routes(app: FastAPI, ctx: ConsoleContext) -> None:
    sign_out = ctx.access.needs_login

    @app.get("/", response_class=HTMLResponse)
    async def fleet(request: Request) -> str:
        person = await ctx.person_of(request)
        found = await ctx.readable(person, "Session")
        return pages.fleet_page(person.name, found, 0, time.time(), sign_out=sign_out)

    @app.get("/ns/{namespace}/sessions/{name}", response_class=HTMLResponse)
    async def session_page(request: Request, namespace: str, name: str) -> str:
        person = await ctx.person_of(request)
        view = await session_view(ctx, person, namespace, name)
        changes = await _changes_within(ctx, view["session"], PAGE_CHANGES_SECONDS)
        return pages.session_page(
            person.name,
            view["session"],
            view["children"],
            view["approvals"],
            view["mayDecide"],
            time.time(),
            may_suspend=view["maySuspend"],
            archive=view.get("archive"),
            changes=changes,
            sign_out=sign_out,
        )

    @app.post("/ns/{namespace}/sessions/{name}/suspend")
    async def suspend_form(request: Request, namespace: str, name: str) -> Response:
        person = await ctx.person_of(request)
        require_same_origin(request)
        form = await form_of(request)
        action = str(form.get("action") or "")
        if action not in SUSPEND_ACTIONS:
            raise Refused(400, "bad_request", f"action must be one of {', '.join(SUSPEND_ACTIONS)}")
        await set_suspend(ctx, person, namespace, name, SUSPEND_ACTIONS[action])
        back = request.headers.get("referer") or session_path(namespace, name)
        return RedirectResponse(urlsplit(back).path or "/", status_code=303)

    @app.post("/api/v1/namespaces/{namespace}/sessions/{name}/suspend")
    async def suspend_json(request: Request, namespace: str, name: str) -> Obj:
        person = await ctx.person_of(request)
        require_same_origin(request)
        body = await json_object_of(request)
        if not isinstance(body.get("suspend"), bool):
            raise Refused(400, "bad_request", "the body must be {suspend: true|false, mode?}")
        spec: Obj = {"suspend": body["suspend"]}
        if body["suspend"]:
            mode = body.get("mode", "afterTurn")
            if mode not in SUSPEND_MODES:
                raise Refused(400, "bad_request", f"mode must be one of {', '.join(SUSPEND_MODES)}")
            spec["suspendMode"] = mode
        return await set_suspend(ctx, person, namespace, name, spec)

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
        view["delivered"] = pages.delivered_revision(st) or None
        view["finished"] = _finished(view["session"])
        # The page's live parts, rendered as the page renders them, for the script to swap in.
        view["fragments"] = {
            "phase": pages._phase(st.get("phase")),
            "turns": str(int(st.get("turns") or 0)),
            "tokens": str(pages.tokens(st)),
            "cost": pages.cost(st),
            "message": pages.esc(st.get("message")),
            "delivered": pages.delivery_html(st.get("delivery")),
            "answer": pages.esc(st.get("answer")),
            "approvals": pages.approval_rows(view["approvals"], ns_deciders, time.time()),
            "plan": pages.plan_html(st.get("plan")),
            "receipt": pages.receipt_html(st.get("lastTurn")),
            "conditions": pages.conditions_html(st.get("conditions") or []),
            "receipts": pages.receipts_html(view.get("archive")),
        }
        return view

    @app.get("/api/v1/namespaces/{namespace}/sessions/{name}/changes")
    async def session_changes(request: Request, namespace: str, name: str) -> Obj:
        """What the Session delivered, turn by turn (`changes.read_changes`), and the page's
        section rendered."""
        person = await ctx.person_of(request)
        session, archive = await find_session(ctx, person, namespace, name)
        changes = await ctx.reader.changes(session)
        return {
            "changes": changes,
            "html": pages.changes_section(session, changes, archive),
        }


async def _changes_within(ctx: ConsoleContext, session: Obj, seconds: float) -> Obj | None:
    """The Session's changes if they are read within `seconds`, else `{"pending": true}`."""
    task = asyncio.ensure_future(ctx.reader.changes(session))
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if task in done:
        return task.result()
    _READING.add(task)
    task.add_done_callback(_READING.discard)
    return {"pending": True}


async def find_session(
    ctx: ConsoleContext, person: Person, namespace: str, name: str
) -> tuple[Obj, Obj | None]:
    """The Session (as the archive keeps it once the object is gone) and its archive's summary
    once it has finished. 403 when the person may not get Sessions in the namespace, whether or
    not it exists (the access rule decides on the namespace alone); 404 when there is none."""
    await ctx.require(person, "get", "sessions", namespace)
    session = await ctx.get("Session", namespace, name)
    archive = None
    if session is None or _finished(session):
        uid = None if session is None else session["metadata"].get("uid")
        archived = await _archived_or_refuse(ctx, namespace, name, uid)
        if archived is not None:
            archive = archive_summary(archived.record)
            # The Session object went with its TTL: the record keeps it as it ended.
            session = session or archived.session
    if session is None:
        raise Refused(404, "not_found", f"session {name} not found in namespace {namespace}")
    return session, archive


async def session_view(ctx: ConsoleContext, person: Person, namespace: str, name: str) -> Obj:
    """A Session with its children, its Approvals (if the person may list them), whether the
    person may decide them, and its archive's summary once it has finished."""
    session, archive = await find_session(ctx, person, namespace, name)
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
    may_suspend = (
        ctx.access.suspends
        and not _finished(session)
        and await ctx.may(person, "patch", "sessions", namespace)
    )
    return {
        "maySuspend": may_suspend,
        "session": session,
        "children": children,
        "approvals": approvals,
        "mayDecide": may_decide,
        "archive": archive,
    }


SUSPEND_MODES = ("afterTurn", "now")
# A page's buttons: what each writes into the Session's spec.
SUSPEND_ACTIONS: dict[str, Obj] = {
    "suspend": {"suspend": True, "suspendMode": "afterTurn"},
    "suspendNow": {"suspend": True, "suspendMode": "now"},
    "resume": {"suspend": False},
}


def session_path(namespace: str, name: str) -> str:
    return f"/ns/{namespace}/sessions/{name}"


async def set_suspend(
    ctx: ConsoleContext, person: Person, namespace: str, name: str, spec: Obj
) -> Obj:
    """Suspend or resume a Session with the person's own rights: who may patch Sessions may
    (docs/turns.md, "Suspend and resume"); an ended one is left as it ended."""
    if not ctx.access.suspends:
        raise Refused(409, "not_supported", "these Sessions cannot be suspended or resumed")
    await ctx.require(person, "patch", "sessions", namespace)
    session, _ = await find_session(ctx, person, namespace, name)
    if _finished(session):
        phase = (session.get("status") or {}).get("phase")
        raise Refused(409, "ended", f"session {name} has ended ({phase})")
    return {"session": await ctx.access.patch_session(person, namespace, name, spec)}


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
