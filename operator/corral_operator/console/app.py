"""The console's HTTP surface: HTML pages for people, the same reads as JSON, the live turn as
Server-Sent Events, and decisions on Approvals (docs/console.md).

Every request names a person (`Access.authenticate`) and is authorised on the namespace it
reads (`Access.allowed`) before anything is read; a namespace the person may not read is
never listed, and asking for an object in it answers 403 with the reason.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)

from ..kube import KubeError
from . import pages
from .access import Access, Person, Refused
from .reader import Source, StreamUnavailable

Obj = dict[str, Any]
COOKIE = "corral_token"
STATIC = Path(__file__).parent / "static"
DECISIONS = ("Approved", "Denied")
TERMINAL = ("Succeeded", "Failed", "Stopped")
# One long-poll on the wire; the browser's EventSource reconnects on its own after a cut.
WIRE_WAIT_SECONDS = 10.0
RETRY_SECONDS = 2.0


def _token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return request.cookies.get(COOKIE) or None


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the pages post nothing else; no multipart parser needed)."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise Refused(400, "bad_request", "expected an urlencoded form")
    text = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[0] for k, v in parse_qs(text, max_num_fields=16).items()}


def _wants_html(request: Request) -> bool:
    return not request.url.path.startswith("/api/")


def _same_origin(request: Request) -> bool:
    """A POST must come from the console's own pages (or from a client that sends no Origin,
    such as curl). The sign-in cookie is SameSite=Strict as well."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return request.headers.get("content-type", "").startswith("application/json")
    return urlsplit(origin).netloc == request.headers.get("host", "")


def build_app(access: Access, reader: Source, *, secure_cookie: bool = False) -> FastAPI:
    app = FastAPI(title="Corral console", docs_url=None, redoc_url=None, openapi_url=None)

    async def person_of(request: Request) -> Person:
        try:
            return await access.authenticate(_token(request))
        except KubeError as err:
            raise Refused(503, "cluster_unavailable", err.reason) from None

    async def may(person: Person, verb: str, resource: str, ns: str, sub: str = "") -> bool:
        try:
            return await access.allowed(person, verb, resource, ns, sub)
        except KubeError as err:
            raise Refused(503, "cluster_unavailable", err.reason) from None

    async def require(person: Person, verb: str, resource: str, ns: str, sub: str = "") -> None:
        if not await may(person, verb, resource, ns, sub):
            what = f"{resource}/{sub}" if sub else resource
            raise Refused(
                403, "forbidden", f"{person.name} may not {verb} {what} in namespace {ns}"
            )

    async def readable(person: Person, kind: str) -> dict[str, list[Obj]]:
        """Every object of `kind` in the namespaces this person may list it in."""
        resource = pages_plural(kind)
        if reader.namespaces is not None:
            allowed = [ns for ns in reader.namespaces if await may(person, "list", resource, ns)]
            return {ns: await reader.objects(kind, ns) for ns in allowed}
        everything = await reader.list_everywhere(kind)
        return {
            ns: items for ns, items in everything.items() if await may(person, "list", resource, ns)
        }

    @app.exception_handler(Refused)
    async def _refused(request: Request, exc: Refused) -> Response:
        if exc.status == 401 and _wants_html(request) and access.needs_login:
            return RedirectResponse("/login", status_code=303)
        body = {"error": exc.error, "reason": exc.reason}
        if _wants_html(request):
            return HTMLResponse(pages.error_page(exc.status, exc.error, exc.reason), exc.status)
        return JSONResponse(body, exc.status)

    @app.exception_handler(KubeError)
    async def _kube(request: Request, exc: KubeError) -> Response:
        status = exc.status if exc.status in (403, 404) else 503
        error = {403: "forbidden", 404: "not_found"}.get(status, "cluster_unavailable")
        if _wants_html(request):
            return HTMLResponse(pages.error_page(status, error, exc.reason), status)
        return JSONResponse({"error": error, "reason": exc.reason}, status)

    # ----------------------------------------------------------------------------- sign in

    @app.get("/healthz")
    async def healthz() -> Obj:
        return {"ok": True}

    @app.get("/static/{name}")
    async def static(name: str) -> Response:
        if name not in ("console.js", "console.css"):
            return JSONResponse({"error": "not_found", "reason": name}, 404)
        return FileResponse(STATIC / name, headers={"Cache-Control": "no-cache"})

    @app.get("/login", response_class=HTMLResponse)
    async def login_form() -> str:
        return pages.login_page()

    @app.post("/login")
    async def login(request: Request) -> Response:
        form = await _form(request)
        token = str(form.get("token") or "").strip()
        if not _same_origin(request):
            raise Refused(403, "forbidden", "cross-site request refused")
        try:
            await access.authenticate(token)
        except Refused as exc:
            return HTMLResponse(pages.login_page(exc.reason), exc.status)
        response = RedirectResponse("/", status_code=303)
        # HttpOnly: no script reads it; Strict: no other site's page sends it.
        response.set_cookie(
            COOKIE, token, httponly=True, samesite="strict", secure=secure_cookie, path="/"
        )
        return response

    @app.post("/logout")
    async def logout() -> Response:
        response = RedirectResponse("/login" if access.needs_login else "/", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # ------------------------------------------------------------------------------- pages

    @app.get("/", response_class=HTMLResponse)
    async def fleet(request: Request) -> str:
        person = await person_of(request)
        return pages.fleet_page(person.name, await readable(person, "Session"), 0, time.time())

    @app.get("/ns/{namespace}/sessions/{name}", response_class=HTMLResponse)
    async def session_page(request: Request, namespace: str, name: str) -> str:
        person = await person_of(request)
        view = await session_view(person, namespace, name)
        return pages.session_page(
            person.name,
            view["session"],
            view["children"],
            view["approvals"],
            view["mayDecide"],
            time.time(),
            archive=view.get("archive"),
        )

    @app.get("/goals", response_class=HTMLResponse)
    async def goals(request: Request) -> str:
        person = await person_of(request)
        found = await readable(person, "Goal")
        evidence = await readable(person, "Evidence")
        return pages.goals_page(
            person.name,
            [g for items in found.values() for g in items],
            [e for items in evidence.values() for e in items],
            time.time(),
        )

    @app.get("/approvals", response_class=HTMLResponse)
    async def approvals(request: Request) -> str:
        person = await person_of(request)
        found = await readable(person, "Approval")
        deciders = {ns for ns in found if await may(person, "update", "approvals", ns, "status")}
        items = [a for objs in found.values() for a in objs]
        return pages.approvals_page(person.name, items, deciders, time.time())

    @app.post("/ns/{namespace}/approvals/{name}/decide")
    async def decide_form(request: Request, namespace: str, name: str) -> Response:
        person = await person_of(request)
        if not _same_origin(request):
            raise Refused(403, "forbidden", "cross-site request refused")
        form = await _form(request)
        await decide(request, person, namespace, name, str(form.get("decision") or ""),
                     str(form.get("reason") or ""))  # fmt: skip
        back = request.headers.get("referer") or "/approvals"
        return RedirectResponse(urlsplit(back).path or "/approvals", status_code=303)

    # ---------------------------------------------------------------------------- JSON API

    @app.get("/api/v1/whoami")
    async def whoami(request: Request) -> Obj:
        person = await person_of(request)
        return {"username": person.name, "groups": list(person.groups)}

    @app.get("/api/v1/sessions")
    async def sessions(request: Request) -> Obj:
        person = await person_of(request)
        found = await readable(person, "Session")
        return {"items": [s for ns in sorted(found) for s in found[ns]]}

    @app.get("/api/v1/approvals")
    async def approvals_json(request: Request) -> Obj:
        person = await person_of(request)
        found = await readable(person, "Approval")
        return {"items": [a for ns in sorted(found) for a in found[ns]]}

    @app.get("/api/v1/goals")
    async def goals_json(request: Request) -> Obj:
        person = await person_of(request)
        found = await readable(person, "Goal")
        return {"items": [g for ns in sorted(found) for g in found[ns]]}

    @app.get("/api/v1/namespaces/{namespace}/sessions/{name}")
    async def session_json(request: Request, namespace: str, name: str) -> Obj:
        person = await person_of(request)
        view = await session_view(person, namespace, name)
        st = view["session"].get("status") or {}
        ns_deciders = {namespace} if view["mayDecide"] else set()
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

    @app.post("/api/v1/namespaces/{namespace}/approvals/{name}/decision")
    async def decision_json(request: Request, namespace: str, name: str) -> Obj:
        person = await person_of(request)
        if not _same_origin(request):
            raise Refused(403, "forbidden", "cross-site request refused")
        try:
            body = await request.json()
        except ValueError:
            raise Refused(400, "bad_request", "the body is not JSON") from None
        if not isinstance(body, dict):
            raise Refused(400, "bad_request", "the body is not a JSON object")
        return await decide(request, person, namespace, name, str(body.get("decision") or ""),
                            str(body.get("reason") or ""))  # fmt: skip

    @app.get("/api/v1/namespaces/{namespace}/sessions/{name}/events")
    async def events(request: Request, namespace: str, name: str) -> Response:
        person = await person_of(request)
        await require(person, "get", "sessions", namespace)
        start = request.query_params.get("offset") or request.headers.get("last-event-id") or "0"
        try:
            offset = max(0, int(start))
        except ValueError:
            raise Refused(400, "bad_request", f"offset {start!r} is not a number") from None
        stream = live_turn(request, person, namespace, name, offset)
        return StreamingResponse(
            stream,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    # ------------------------------------------------------------------------------ helpers

    async def session_view(person: Person, namespace: str, name: str) -> Obj:
        await require(person, "get", "sessions", namespace)
        session = await reader.get("Session", namespace, name)
        archive = None
        if session is None or _finished(session):
            uid = None if session is None else session["metadata"].get("uid")
            archived = await archived_or_refuse(namespace, name, uid)
            if archived is not None:
                archive = archive_summary(archived.record)
                # The Session object went with its TTL: the record keeps it as it ended.
                session = session or archived.session
        if session is None:
            raise Refused(404, "not_found", f"session {name} not found in {namespace}")
        siblings = await reader.objects("Session", namespace)
        children = [
            s for s in siblings
            if ((s.get("spec") or {}).get("parentRef") or {}).get("name") == name
        ]  # fmt: skip
        approvals: list[Obj] = []
        if await may(person, "list", "approvals", namespace):
            approvals = [
                a for a in await reader.objects("Approval", namespace)
                if ((a.get("spec") or {}).get("sessionRef") or {}).get("name") == name
            ]  # fmt: skip
        may_decide = await may(person, "update", "approvals", namespace, "status")
        return {
            "session": session,
            "children": children,
            "approvals": approvals,
            "mayDecide": may_decide,
            "archive": archive,
        }

    async def archived_or_refuse(namespace: str, name: str, uid: str | None) -> Any:
        try:
            return await reader.archived(namespace, name, uid)
        except OSError as err:  # the volume or the object store: say so, as the reader does
            why = f"the archive cannot be read: {err}"
            raise Refused(503, "archive_unavailable", why) from None

    async def decide(
        request: Request, person: Person, namespace: str, name: str, decision: str, reason: str
    ) -> Obj:
        if not _same_origin(request):
            raise Refused(403, "forbidden", "cross-site request refused")
        if decision not in DECISIONS:
            raise Refused(400, "bad_request", f"decision must be one of {', '.join(DECISIONS)}")
        await require(person, "update", "approvals", namespace, "status")
        written = await access.decide(person, namespace, name, decision, reason)
        return {"approval": written}

    async def live_turn(
        request: Request, person: Person, namespace: str, name: str, offset: int
    ) -> AsyncIterator[bytes]:
        """The Session's wire events from `offset`, as SSE, for as long as the browser stays
        and the person may still read the Session. Before the pod serves and after it went,
        `state` events say why nothing streams."""
        said = ""

        async def state(text: str) -> bytes:
            nonlocal said
            if text == said:
                return b": waiting\n\n"
            said = text
            return _sse("state", {"state": text})

        while not await request.is_disconnected():
            if not await may(person, "get", "sessions", namespace):
                yield _sse("end", {"reason": "your access to this namespace was withdrawn"})
                return
            session = await reader.get("Session", namespace, name)
            if session is None:
                async for page in from_archive(namespace, name, None, offset):
                    yield page
                yield _sse("end", {"reason": "the session is gone"})
                return
            phase = (session.get("status") or {}).get("phase") or "Pending"
            try:
                client = await reader.wire(session)
            except StreamUnavailable as why:
                if phase in TERMINAL:
                    uid = session["metadata"].get("uid")
                    async for page in from_archive(namespace, name, uid, offset):
                        yield page
                    yield _sse("end", {"reason": f"the session is {phase}; {why}"})
                    return
                yield await state(str(why))
                await asyncio.sleep(RETRY_SECONDS)
                continue
            try:
                async for chunk in _pump(request, person, namespace, client, name, offset, state):
                    if isinstance(chunk, int):
                        offset = chunk
                    else:
                        yield chunk
            finally:
                await client.aclose()
            if phase in TERMINAL:
                yield _sse("end", {"reason": f"the session is {phase}"})
                return
            await asyncio.sleep(RETRY_SECONDS)

    async def from_archive(
        namespace: str, name: str, uid: str | None, offset: int
    ) -> AsyncIterator[bytes]:
        """The archived transcript from `offset`, at the live wire's offsets (docs/history.md)."""
        try:
            archived = await reader.archived(namespace, name, uid)
        except OSError as err:
            yield _sse("state", {"state": f"the archive cannot be read: {err}"})
            return
        if archived is None:
            return
        yield _sse("state", {"state": "archived"})
        for event in archived.events_from(offset):
            yield _sse("wire", event, event_id=int(event.get("offset", offset)) + 1)

    async def _pump(
        request: Request,
        person: Person,
        namespace: str,
        client: Any,
        conversation: str,
        offset: int,
        state: Callable[[str], Awaitable[bytes]],
    ) -> AsyncIterator[bytes | int]:
        """Long-poll one harness until it fails, the session ends, access is withdrawn or the
        browser leaves; yields SSE chunks, and the next offset after each page."""
        first = True
        phase = "Running"
        while not await request.is_disconnected():
            wait = 0.0 if phase in TERMINAL else WIRE_WAIT_SECONDS
            try:
                events, next_offset = await reader.updates(client, conversation, offset, wait)
            except StreamUnavailable as why:
                yield await state(str(why))
                return
            if first:
                yield await state("live")
                first = False
            for event in events:
                yield _sse("wire", event, event_id=int(event.get("offset", offset)) + 1)
            offset = max(offset, next_offset)
            yield offset
            if events:
                continue
            if phase in TERMINAL or not await may(person, "get", "sessions", namespace):
                return
            yield b": keepalive\n\n"
            session = await reader.get("Session", namespace, conversation)
            phase = ((session or {}).get("status") or {}).get("phase") or "Pending"

    return app


def _finished(session: Obj) -> bool:
    return ((session.get("status") or {}).get("phase") or "") in TERMINAL


def archive_summary(record: Obj) -> Obj:
    """What a page shows of an archive: when and why it was written, and the receipts."""
    return {
        "archivedAt": record.get("archivedAt"),
        "cause": record.get("cause"),
        "events": record.get("events"),
        "receipts": list(record.get("receipts") or []),
    }


def pages_plural(kind: str) -> str:
    from .reader import PLURALS

    return PLURALS[kind]


def _sse(event: str, data: Obj, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
