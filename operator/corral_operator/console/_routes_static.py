"""The console's routes that need no person: its health check and its script and stylesheet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse, Response

STATIC = Path(__file__).parent / "static"


def register_static_routes(app: FastAPI) -> None:
    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.get("/static/{name}")
    async def static(name: str) -> Response:
        if name not in ("console.js", "console.css"):
            return JSONResponse({"error": "not_found", "reason": name}, 404)
        return FileResponse(STATIC / name, headers={"Cache-Control": "no-cache"})
