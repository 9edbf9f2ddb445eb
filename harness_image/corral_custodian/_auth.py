"""Caller authentication, as ASGI middleware in front of each of the custodian's listeners.

The harness-facing port answers only the pod-local credential, presented as
`Authorization: Bearer <credential>` (the Menu and approval clients) or as `x-api-key` (the
Anthropic SDK's api_key: the harness's model calls), and lets `/readyz` through for probes.
The operator port answers only the Session's wire token as a bearer token. Comparisons are
constant-time; every refusal is a 401 with a reason and a log line naming the client and path.
"""

from __future__ import annotations

import hmac
import json
import logging

from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger("corral_custodian.auth")


def _header(scope: Scope, name: bytes) -> bytes:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value)
    return b""


def _bearer(value: bytes) -> bytes:
    scheme, _, token = value.partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


class RequireCredential:
    def __init__(
        self,
        app: ASGIApp,
        secret: str,
        *,
        what: str,
        accept_api_key: bool,
        open_paths: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self._secret = secret.encode()
        self._what = what
        self._accept_api_key = accept_api_key
        self._open = open_paths

    def _verdict(self, scope: Scope) -> str | None:
        bearer = _bearer(_header(scope, b"authorization"))
        api_key = _header(scope, b"x-api-key") if self._accept_api_key else b""
        if not bearer and not api_key:
            return f"no credential was presented; this endpoint requires {self._what}"
        # Both compared, each in constant time, so timing says nothing about which was tried.
        ok_bearer = hmac.compare_digest(bearer, self._secret)
        ok_key = hmac.compare_digest(api_key, self._secret)
        if ok_bearer or ok_key:
            return None
        return f"the credential presented is not {self._what}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self._open:
            await self.app(scope, receive, send)
            return
        reason = self._verdict(scope)
        if reason is None:
            await self.app(scope, receive, send)
            return
        client = scope.get("client") or ("?", 0)
        path = scope.get("path", "")
        log.warning(
            "refused %s %s from %s:%s: %s", scope.get("method"), path, client[0], client[1], reason
        )
        if path.startswith("/v1/messages"):
            # The SDK's shape, so the harness's engine reports the reason and does not retry.
            body = {"type": "error", "error": {"type": "authentication_error", "message": reason}}
        else:
            body = {"error": "unauthorized", "reason": reason}
        payload = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"x-should-retry", b"false"),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
