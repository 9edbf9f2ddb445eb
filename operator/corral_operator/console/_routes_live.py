"""A Session's live turn as Server-Sent Events: its harness's wire while the pod serves, its
archived transcript once the pod (or the Session) is gone, and `state` events in between."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from corral_api.kinds import FINAL_PHASES

from ._context import ConsoleContext, Obj
from ._routes_sessions import find_session
from .access import Person, Refused
from .reader import StreamUnavailable

# One long-poll on the wire; the browser's EventSource reconnects on its own after a cut.
WIRE_WAIT_SECONDS = 10.0
RETRY_SECONDS = 2.0


def register_live_routes(app: FastAPI, ctx: ConsoleContext) -> None:
    @app.get("/api/v1/namespaces/{namespace}/sessions/{name}/events")
    async def events(request: Request, namespace: str, name: str) -> Response:
        person = await ctx.person_of(request)
        start = request.query_params.get("offset") or request.headers.get("last-event-id") or "0"
        try:
            offset = max(0, int(start))
        except ValueError:
            raise Refused(400, "bad_request", f"offset {start!r} is not a number") from None
        # 403 or 404 before a stream starts: an unknown Session is not an empty stream.
        await find_session(ctx, person, namespace, name)
        stream = live_turn(ctx, request, person, namespace, name, offset)
        return StreamingResponse(
            stream,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


async def live_turn(
    ctx: ConsoleContext, request: Request, person: Person, namespace: str, name: str, offset: int
) -> AsyncIterator[bytes]:
    """The Session's wire events from `offset`, as SSE, for as long as the browser stays
    and the person may still read the Session. Before the pod serves and after it went,
    `state` events say why nothing streams."""
    reader = ctx.reader
    said = ""

    async def state(text: str) -> bytes:
        nonlocal said
        if text == said:
            return b": waiting\n\n"
        said = text
        return _sse("state", {"state": text})

    while not await request.is_disconnected():
        if not await ctx.may(person, "get", "sessions", namespace):
            yield _sse("end", {"reason": "your access to this namespace was withdrawn"})
            return
        session = await ctx.get("Session", namespace, name)
        if session is None:
            async for page in _from_archive(ctx, namespace, name, None, offset):
                yield page
            yield _sse("end", {"reason": "the session is gone"})
            return
        phase = (session.get("status") or {}).get("phase") or "Pending"
        try:
            client = await reader.wire(session)
        except StreamUnavailable as why:
            if phase in FINAL_PHASES:
                uid = session["metadata"].get("uid")
                async for page in _from_archive(ctx, namespace, name, uid, offset):
                    yield page
                yield _sse("end", {"reason": f"the session is {phase}; {why}"})
                return
            yield await state(str(why))
            await asyncio.sleep(RETRY_SECONDS)
            continue
        try:
            pump = _pump(ctx, request, person, namespace, client, name, offset, phase, state)
            async for chunk in pump:
                if isinstance(chunk, int):
                    offset = chunk
                else:
                    yield chunk
        finally:
            await client.aclose()
        if phase in FINAL_PHASES:
            yield _sse("end", {"reason": f"the session is {phase}"})
            return
        await asyncio.sleep(RETRY_SECONDS)


async def _from_archive(
    ctx: ConsoleContext, namespace: str, name: str, uid: str | None, offset: int
) -> AsyncIterator[bytes]:
    """The archived transcript from `offset`, at the live wire's offsets (docs/history.md)."""
    try:
        archived = await ctx.reader.archived(namespace, name, uid)
    except OSError as err:
        yield _sse("state", {"state": f"the archive cannot be read: {err}"})
        return
    if archived is None:
        return
    yield _sse("state", {"state": "archived"})
    for event in archived.events_from(offset):
        yield _sse("wire", event, event_id=int(event.get("offset", offset)) + 1)


async def _pump(
    ctx: ConsoleContext,
    request: Request,
    person: Person,
    namespace: str,
    client: Any,
    conversation: str,
    offset: int,
    phase: str,
    state: Callable[[str], Awaitable[bytes]],
) -> AsyncIterator[bytes | int]:
    """Long-poll one harness until it fails, the session ends, access is withdrawn or the
    browser leaves; yields SSE chunks, and the next offset after each page. A finished
    Session's pod replays its record: `finished`, never `live`."""
    first = True
    while not await request.is_disconnected():
        wait = 0.0 if phase in FINAL_PHASES else WIRE_WAIT_SECONDS
        try:
            events, next_offset = await ctx.reader.updates(client, conversation, offset, wait)
        except StreamUnavailable as why:
            yield await state(str(why))
            return
        if first:
            yield await state("finished" if phase in FINAL_PHASES else "live")
            first = False
        for event in events:
            yield _sse("wire", event, event_id=int(event.get("offset", offset)) + 1)
        offset = max(offset, next_offset)
        yield offset
        if events:
            continue
        if phase in FINAL_PHASES or not await ctx.may(person, "get", "sessions", namespace):
            return
        yield b": keepalive\n\n"
        session = await ctx.get("Session", namespace, conversation)
        phase = ((session or {}).get("status") or {}).get("phase") or "Pending"


def _sse(event: str, data: Obj, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
