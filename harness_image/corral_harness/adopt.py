"""A pooled harness: up and ready before it has a Session, bound to one by a single adopt.

A warm-pool pod (docs/warm-pool.md, ADR 0074) starts the harness with no wire token, no
custodian credential and no workspace; its pod spec carries only the SHA-256 of a one-time key
(`CORRAL_ADOPT_KEY_SHA256`), whose text only the operator holds. Until adopted the harness
answers `/readyz` and `POST /adopt` and refuses everything else (423 `not_adopted`). The first
adopt presenting the key consumes it, whatever happens next: it checks the repository out
through the tools container (as the tools uid, like a cold pod's init container), keeps the
delivered token and credential in its own state directory, builds the ordinary wire app from
them and hands every later request to it. A second adopt is 409 `already_adopted`. Nothing
arrives through a mounted volume, so nothing waits for a kubelet to refresh one.

The adoption is recorded in the state directory (the pod's own emptyDir), so a restarted
harness container comes back bound to the same Session instead of waiting for a key that was
spent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import importlib
import json
import logging
import os
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from corral_api.wire import AdoptResponse, HarnessAdoptRequest
from corral_common.asgi import bearer_token, no_receive
from corral_common.checkout import checkout_argv

from .config import HarnessConfig
from .server import workspace_for

log = logging.getLogger("corral.harness.adopt")

ADOPT_KEY_ENV = "CORRAL_ADOPT_KEY_SHA256"
RECORD = "adoption.json"
CHECKOUT_TIMEOUT_SECONDS = 600.0
MAX_ADOPT_BYTES = 1 << 20

AppFactory = Callable[[HarnessConfig], FastAPI]


def key_digest(key: str) -> str:
    """What the pod spec carries instead of the key."""
    return hashlib.sha256(key.encode()).hexdigest()


async def _answer(send: Send, status: int, body: dict[str, Any]) -> None:
    await JSONResponse(body, status_code=status)({"type": "http"}, no_receive, send)


async def _read_body(receive: Receive) -> bytes | None:
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        body += message.get("body", b"")
        if len(body) > MAX_ADOPT_BYTES:
            return None
        if not message.get("more_body"):
            return bytes(body)


class PoolGate:
    """The ASGI app of a pooled harness: the gate until adopted, the wire app afterwards."""

    def __init__(self, config: HarnessConfig, key_sha256: str, make_app: AppFactory) -> None:
        if len(key_sha256) != 64:
            raise ValueError(f"{ADOPT_KEY_ENV} must be a SHA-256 in hex")
        self._config = config
        self._key = key_sha256.lower().encode()
        self._make_app = make_app
        self._inner: FastAPI | None = None
        self._consumed = False
        self._lock = asyncio.Lock()
        self._stack = AsyncExitStack()
        self._bound_dir = config.state_dir / "adopted"
        self._probe = workspace_for(config)
        self._preloaded: asyncio.Future[None] | None = None

    # ---------------------------------------------------------------------------- ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        if path == "/adopt":
            if scope.get("method") != "POST":
                await _answer(send, 405, {"error": "bad_request", "reason": "POST /adopt"})
                return
            await self._adopt(scope, receive, send)
            return
        inner = self._inner
        if inner is not None:
            await inner(scope, receive, send)
        elif path == "/readyz":
            await self._readyz(send)
        else:
            reason = "this pooled harness serves nothing before the operator adopts it"
            await _answer(send, 423, {"error": "not_adopted", "reason": reason})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._resume()
                except Exception as exc:  # a broken record must not look like a fresh pod
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                # Load the engine now, while nothing waits, so an adopted turn does not; the
                # pod is ready (adoptable) once it is loaded.
                self._preloaded = asyncio.get_running_loop().run_in_executor(None, _preload_engine)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._stack.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _readyz(self, send: Send) -> None:
        if self._consumed:
            await _answer(send, 503, {"ready": False, "reason": "the adoption failed"})
            return
        if self._preloaded is not None and not self._preloaded.done():
            await _answer(send, 503, {"ready": False, "reason": "loading the engine"})
            return
        healthy = getattr(self._probe, "healthy", None)
        if healthy is not None and not await healthy():
            await _answer(send, 503, {"ready": False, "reason": "the exec service"})
            return
        await _answer(send, 200, {"ready": True, "adopted": False})

    # --------------------------------------------------------------------------- adopt

    async def _adopt(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = hashlib.sha256(bearer_token(scope)).hexdigest().encode()
        if not hmac.compare_digest(given, self._key):
            client = scope.get("client") or ("?", 0)
            log.warning("refused an adopt from %s: not the pod's key", client[0])
            reason = "the adopt key is missing or wrong"
            await _answer(send, 401, {"error": "unauthorized", "reason": reason})
            return
        if self._consumed or self._lock.locked():
            reason = "this pod's one-time key is spent: it was adopted already"
            await _answer(send, 409, {"error": "already_adopted", "reason": reason})
            return
        async with self._lock:
            self._consumed = True  # the key is spent from here on, whatever follows
            # On disk too, so a restarted container does not take the key again.
            self._bound_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            started = time.monotonic()
            raw = await _read_body(receive)
            try:
                request = HarnessAdoptRequest.model_validate_json(raw or b"null")
            except ValidationError as exc:
                await _answer(send, 400, {"error": "bad_request", "reason": _reason(exc)})
                return
            if Path(request.grantedRoot) != self._config.granted_root:
                reason = (
                    f"this pooled pod serves the granted root {self._config.granted_root}, not "
                    f"{request.grantedRoot!r}"
                )
                await _answer(send, 400, {"error": "bad_request", "reason": reason})
                return
            # The clone runs in the tools container while the wire app is built here.
            checkout = asyncio.ensure_future(self._checkout(request))
            self._keep_secrets(request)
            app = self._make_app(self._bound_config(request.readOnly))
            failure = await checkout
            if failure is not None:
                await _answer(send, 500, {"error": "checkout_failed", "reason": failure})
                return
            self._keep_record(request)
            await self._serve(app)
            seconds = time.monotonic() - started
            log.info("adopted in %.3fs", seconds)
            answer = AdoptResponse(adopted=True, seconds=round(seconds, 4))
            await _answer(send, 200, answer.model_dump())

    async def _checkout(self, request: HarnessAdoptRequest) -> str | None:
        """Clone through the workspace port: in a pod, the tools container's exec service,
        so the files belong to the tools uid, as a cold pod's checkout init container makes
        them."""
        co = request.checkout
        # "." is the granted root as the tools container sees it (its own path for it).
        argv = checkout_argv(co.repo, co.ref, co.branch, ".")
        outcome = await self._probe.run(
            argv, timeout=CHECKOUT_TIMEOUT_SECONDS, keep_bytes=16 * 1024
        )
        if outcome.exit_code != 0:
            return f"the checkout exited {outcome.exit_code}: {outcome.output.strip()[-2000:]}"
        return None

    def _keep_secrets(self, request: HarnessAdoptRequest) -> None:
        """The token and credential into files only this container mounts (before the
        record, so a record on disk always names files that exist)."""
        for name, text in (
            ("token", request.wireToken),
            ("custodian", request.custodianCredential),
        ):
            path = self._bound_dir / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)

    def _keep_record(self, request: HarnessAdoptRequest) -> None:
        record = {"readOnly": request.readOnly}
        tmp = self._bound_dir / f"{RECORD}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self._bound_dir / RECORD)

    def _bound_config(self, read_only: bool) -> HarnessConfig:
        return dataclasses.replace(
            self._config,
            token_file=self._bound_dir / "token",
            custodian_credential_file=self._bound_dir / "custodian",
            read_only=read_only,
        )

    async def _serve(self, app: FastAPI) -> None:
        await self._stack.enter_async_context(app.router.lifespan_context(app))
        self._inner = app

    async def _resume(self) -> None:
        """A restarted container of an adopted pod: bound again from the record."""
        record = self._bound_dir / RECORD
        if record.exists():
            self._consumed = True
            read_only = bool(json.loads(record.read_text()).get("readOnly"))
            await self._serve(self._make_app(self._bound_config(read_only)))
            log.info("resumed an adoption from %s", record)
        elif self._bound_dir.exists():
            self._consumed = True  # a failed adoption: the key was spent on it


def _preload_engine() -> None:
    # Load the adapter this pod will run (CORRAL_ENGINE), not the SDK regardless: the SDK loads
    # far slower (ADR 0014), and the pod says ready only once it is in.
    from .engine.choice import engine_module

    try:
        importlib.import_module(engine_module(os.environ.get("CORRAL_ENGINE") or "lean"))
    except Exception:  # the first turn imports it again and reports the failure
        log.exception("preloading the engine failed")


def _reason(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
        for err in exc.errors()[:5]
    )


def gate_for(config: HarnessConfig, make_app: AppFactory) -> ASGIApp | None:
    """A PoolGate when the environment names an adopt key, else None (an ordinary harness)."""
    key = os.environ.get(ADOPT_KEY_ENV, "").strip()
    return PoolGate(config, key, make_app) if key else None
