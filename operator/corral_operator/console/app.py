"""The console's HTTP surface: HTML pages for people, the same reads as JSON, the live turn as
Server-Sent Events, and decisions on Approvals (docs/console.md).

Every request names a person (`Access.authenticate`) and is authorised on the namespace it
reads (`Access.allowed`) before anything is read; a namespace the person may not read is
never listed, and asking for an object in it answers 403 with the reason.

Each concern registers its own routes (`_routes_*.py`); they share a `ConsoleContext`.
"""

from __future__ import annotations

from fastapi import FastAPI

from ._context import ConsoleContext
from ._errors import register_error_handlers
from ._routes_approvals import register_approval_routes
from ._routes_goals import register_goal_routes
from ._routes_live import register_live_routes
from ._routes_sessions import register_session_routes
from ._routes_signin import register_signin_routes
from ._routes_static import register_static_routes
from .access import Access
from .reader import Source


def build_app(access: Access, reader: Source, *, secure_cookie: bool = False) -> FastAPI:
    app = FastAPI(title="Corral console", docs_url=None, redoc_url=None, openapi_url=None)
    ctx = ConsoleContext(access, reader, secure_cookie)
    register_error_handlers(app, ctx)
    register_static_routes(app)
    register_signin_routes(app, ctx)
    register_session_routes(app, ctx)
    register_goal_routes(app, ctx)
    register_approval_routes(app, ctx)
    register_live_routes(app, ctx)
    return app
