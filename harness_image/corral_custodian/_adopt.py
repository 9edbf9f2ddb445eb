"""A pooled custodian: listening before it has a Session, bound to one by a single adopt.

In a warm-pool pod (docs/warm-pool.md, ADR 0074) the custodian starts with its listeners, its
state directory, the cluster's address and the Agent's model key, but without a Session: no
wire token, no pod-local credential, no Session identity, no Agent spec, no budget. Its pod
spec carries only the SHA-256 of a one-time key (`CORRAL_ADOPT_KEY_SHA256`). Until adopted both
listeners answer `/readyz` (harness port) and `POST /v1/adopt` (operator port) and refuse the
rest with 423 `not_adopted`. The first adopt presenting the key spends it: the delivered values
join the environment and go through the same `from_env` a cold custodian's environment goes
through, so every check applies alike. A second adopt is 409 `already_adopted`. The adoption is
recorded in the state directory, so a restarted container comes back bound to its Session.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from corral_api.wire import AdoptResponse, CustodianAdoptRequest
from corral_common.asgi import bearer_token, no_receive

from ._app import Custodian, create_app, create_operator_app
from ._egress import use_egress_gateway
from ._secrets import redact
from .settings import SettingsError, _split_addr, from_env, register_credentials

log = logging.getLogger("corral_custodian.adopt")

ADOPT_KEY_ENV = "CORRAL_ADOPT_KEY_SHA256"
RECORD = "adoption.json"
MAX_ADOPT_BYTES = 1 << 20

Listen = Callable[[list[tuple[ASGIApp, str, int]]], Awaitable[None]]


async def _answer(send: Send, status: int, body: dict[str, Any]) -> None:
    await JSONResponse(body, status_code=status)({"type": "http"}, no_receive, send)


def adopted_env(
    base: Mapping[str, str], request: CustodianAdoptRequest, files: Path
) -> dict[str, str]:
    """The environment a cold custodian of this Session would have had: the pod's own (minus
    the key's digest) plus what the adopt delivered, secrets as files only this container
    reads."""
    env = {k: v for k, v in base.items() if k != ADOPT_KEY_ENV}
    env.update(
        {
            "CORRAL_CUSTODIAN_CREDENTIAL_FILE": str(files / "custodian"),
            "CORRAL_WIRE_TOKEN_FILE": str(files / "token"),
            "CORRAL_SESSION_NAME": request.session.name,
            "CORRAL_SESSION_NAMESPACE": request.session.namespace,
            "CORRAL_SESSION_UID": request.session.uid,
            "CORRAL_AGENT_NAME": request.agentName,
            "CORRAL_AGENT_SPEC_JSON": json.dumps(request.agent.wire(), sort_keys=True),
            "CORRAL_SESSION_BRANCH": request.branch,
            "CORRAL_GIT_REMOTE_URL": request.gitRemoteUrl,
            "CORRAL_READ_ONLY": "true" if request.readOnly else "false",
        }
    )
    if request.egressCredential is not None:
        # The egress gateway's proxy (CORRAL_EGRESS_PROXY) is the pod's; its credential, the
        # Session's, arrives with the adopt (docs/egress.md).
        env["CORRAL_EGRESS_CREDENTIAL_FILE"] = str(files / "egress")
    if request.memoryDsn is not None:
        env["CORRAL_MEMORY_DSN_FILE"] = str(files / "memory-dsn")
    for name, value in (
        ("CORRAL_BUDGET_TOKENS", request.budget.tokens),
        ("CORRAL_BUDGET_COST", request.budget.costUSD),
    ):
        if value is not None:
            env[name] = repr(value)
    return env


class PooledCustodian:
    """Both listeners' gate, and the ordinary apps once adopted."""

    def __init__(self, env: Mapping[str, str], key_sha256: str) -> None:
        if len(key_sha256) != 64:
            raise SettingsError(f"{ADOPT_KEY_ENV} must be a SHA-256 in hex")
        state = env.get("CORRAL_STATE_DIR", "").strip()
        if not state:
            raise SettingsError(f"{ADOPT_KEY_ENV} needs CORRAL_STATE_DIR to keep the adoption")
        self._env = dict(env)
        self._key = key_sha256.lower().encode()
        self._dir = Path(state) / "adopted"
        self._lock = asyncio.Lock()
        self._consumed = False
        self.core: Custodian | None = None
        self._harness_app: FastAPI | None = None
        self._operator_app: FastAPI | None = None

    def resume(self) -> None:
        """A restarted container of an adopted pod binds again from its record."""
        record = self._dir / RECORD
        if record.exists():
            self._consumed = True
            self._bind(CustodianAdoptRequest.model_validate_json(record.read_text()))
        elif self._dir.exists():
            self._consumed = True  # the key was spent on an adoption that failed

    def _bind(self, request: CustodianAdoptRequest) -> None:
        settings = from_env(adopted_env(self._env, request, self._dir))
        register_credentials(settings)  # the wire token and credential it just delivered
        use_egress_gateway(settings, os.environ)  # before any client of the core is made
        core = Custodian(settings)
        self._harness_app = create_app(core)
        self._operator_app = create_operator_app(core)
        self.core = core

    def _keep(self, request: CustodianAdoptRequest) -> None:
        for name, text in (
            ("token", request.wireToken),
            ("custodian", request.custodianCredential),
            ("egress", request.egressCredential),
            ("memory-dsn", request.memoryDsn),
        ):
            if text is None:
                continue
            fd = os.open(self._dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        tmp = self._dir / f"{RECORD}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(request.model_dump_json())
        os.replace(tmp, self._dir / RECORD)

    async def adopt(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = hashlib.sha256(bearer_token(scope)).hexdigest().encode()
        if not hmac.compare_digest(given, self._key):
            client = scope.get("client") or ("?", 0)
            log.warning("refused an adopt from %s: not the pod's key", client[0])
            await _answer(
                send, 401, {"error": "unauthorized", "reason": "the adopt key is missing or wrong"}
            )
            return
        if self._consumed or self._lock.locked():
            reason = "this pod's one-time key is spent: it was adopted already"
            await _answer(send, 409, {"error": "already_adopted", "reason": reason})
            return
        async with self._lock:
            self._consumed = True
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            started = time.monotonic()
            raw = b""
            while True:
                message = await receive()
                raw += message.get("body", b"")
                if len(raw) > MAX_ADOPT_BYTES or not message.get("more_body"):
                    break
            try:
                request = CustodianAdoptRequest.model_validate_json(raw or b"null")
                self._keep(request)
                self._bind(request)
            except ValidationError as exc:
                # Without the input: a wrong-shaped field may be a credential the adopt carried.
                reason = "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                    for e in exc.errors(include_url=False, include_input=False)
                )
                await _answer(send, 400, {"error": "bad_request", "reason": reason[:2000]})
                return
            except SettingsError as exc:
                await _answer(
                    send, 400, {"error": "bad_request", "reason": redact(str(exc))[:2000]}
                )
                return
            seconds = time.monotonic() - started
            answer = AdoptResponse(adopted=True, seconds=round(seconds, 4))
            await _answer(send, 200, answer.model_dump())

    def gate(self, *, operator: bool) -> ASGIApp:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                return
            path = scope.get("path", "")
            if operator and path == "/v1/adopt" and scope.get("method") == "POST":
                await self.adopt(scope, receive, send)
                return
            inner = self._operator_app if operator else self._harness_app
            if inner is not None:
                await inner(scope, receive, send)
            elif path == "/readyz" and not operator:
                ready = not self._consumed
                await _answer(send, 200 if ready else 503, {"ok": ready, "adopted": False})
            else:
                reason = "this pooled custodian serves nothing before the operator adopts it"
                await _answer(send, 423, {"error": "not_adopted", "reason": reason})

        return app


async def serve_pooled(env: Mapping[str, str], key_sha256: str, listen: Listen) -> None:
    """Both listeners behind the gate, until stopped."""
    host, port = _split_addr(env.get("CORRAL_CUSTODIAN_ADDR", ""), "CORRAL_CUSTODIAN_ADDR")
    op_host, op_port = _split_addr(
        env.get("CORRAL_CUSTODIAN_OPERATOR_ADDR", ""), "CORRAL_CUSTODIAN_OPERATOR_ADDR"
    )
    pooled = PooledCustodian(env, key_sha256)
    pooled.resume()
    try:
        await listen(
            [
                (pooled.gate(operator=False), host, port),
                (pooled.gate(operator=True), op_host, op_port),
            ]
        )
    finally:
        if pooled.core is not None:
            await pooled.core.aclose()
