"""Small pieces of raw ASGI that the harness's and the custodian's adoption listeners share
(they answer before any framework app exists, so they read the scope themselves)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def bearer_token(scope: Mapping[str, Any]) -> bytes:
    """The token of `Authorization: Bearer <token>` in an HTTP scope; b"" when there is none."""
    for name, value in scope.get("headers") or ():
        if bytes(name).lower() == b"authorization":
            scheme, _, token = bytes(value).partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else b""
    return b""


async def no_receive() -> dict[str, Any]:
    """A `receive` for a response that never reads the request."""
    return {"type": "http.disconnect"}


# A listening socket the harness or the custodian inherits and serves on instead of binding
# its address (`corral run` binds it and holds it until the process has it: a port only
# chosen could be taken by another process first, and the run would speak to that one).
LISTEN_FD_ENV = "CORRAL_LISTEN_FD"
