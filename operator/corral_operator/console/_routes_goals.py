"""The Goals: their page (with the Evidence the person may read) and the same list as JSON."""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

from . import pages
from ._context import ConsoleContext, Obj


def register_goal_routes(app: FastAPI, ctx: ConsoleContext) -> None:
    @app.get("/goals", response_class=HTMLResponse)
    async def goals(request: Request) -> str:
        person = await ctx.person_of(request)
        found = await ctx.readable(person, "Goal")
        evidence = await ctx.readable(person, "Evidence")
        return pages.goals_page(
            person.name,
            [g for items in found.values() for g in items],
            [e for items in evidence.values() for e in items],
            time.time(),
            sign_out=ctx.access.needs_login,
        )

    @app.get("/api/v1/goals")
    async def goals_json(request: Request) -> Obj:
        person = await ctx.person_of(request)
        found = await ctx.readable(person, "Goal")
        return {"items": [g for ns in sorted(found) for g in found[ns]]}
