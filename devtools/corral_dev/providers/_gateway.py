"""A STAND-IN for a Messages-compatible gateway, on loopback, for tests: it wants its key in
its own header (`--auth-header`, with `--auth-scheme` before it, e.g. `authorization: Bearer
KEY`), and forwards `POST /v1/messages` to a Messages API server behind it.

A missing or wrong key is refused with 401 and an Anthropic-style `authentication_error`; so is
a request that carries `x-api-key` when that is not the gateway's header (a custodian sending
the key where this gateway does not look for it would be sending it somewhere it does not
belong). The body goes upstream as it came, with the upstream's own key (`--upstream-key`) if
one is given, and the answer comes back as the upstream gave it: its SSE byte for byte.

Test hooks: `GET`/`DELETE /_standin/requests` (what it received: path, model, the headers of
interest, and whether it was let through).

`main(argv)` (`python -m corral_dev.providers gateway --upstream URL --key KEY ...`) prints
`{"url": ..., "auth_header": ..., "auth_scheme": ...}` once it listens.
"""

from __future__ import annotations

import argparse
import hmac
import json
import sys
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..ports import free_port
from ._vertex import RunningApp, anthropic_error, relay, serve_announced, serve_in_thread

DEFAULT_AUTH_HEADER = "authorization"
DEFAULT_AUTH_SCHEME = "Bearer"
_FORWARDED = ("content-type", "anthropic-version", "anthropic-beta")
_HEADERS_OF_INTEREST = ("x-api-key", "authorization", "anthropic-version", "anthropic-beta")


class GatewayStandIn:
    """A Messages-compatible gateway, stood in for; `app` is the ASGI app."""

    def __init__(
        self,
        upstream: str,
        *,
        key: str,
        auth_header: str = DEFAULT_AUTH_HEADER,
        auth_scheme: str | None = DEFAULT_AUTH_SCHEME,
        upstream_key: str | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.key = key
        self.auth_header = auth_header.lower()
        self.auth_scheme = auth_scheme or None
        self.upstream_key = upstream_key
        self.requests: list[dict[str, Any]] = []
        self.app = Starlette(
            routes=[
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/_standin/requests", self._requests, methods=["GET", "DELETE"]),
                Route("/readyz", self._ready, methods=["GET"]),
            ]
        )

    def refusal(self, request: Request) -> str | None:
        """Why the caller's credential is refused, or None."""
        if self.auth_header != "x-api-key" and "x-api-key" in request.headers:
            return f"x-api-key is not accepted by this gateway; send the key in {self.auth_header}"
        given = request.headers.get(self.auth_header)
        if given is None:
            return f"no key: this gateway wants it in {self.auth_header}"
        if self.auth_scheme is not None:
            scheme, _, given = given.partition(" ")
            if scheme.lower() != self.auth_scheme.lower():
                return f"{self.auth_header} must be '{self.auth_scheme} <key>'"
        if not hmac.compare_digest(given.strip().encode(), self.key.encode()):
            return "invalid key"
        return None

    async def _messages(self, request: Request) -> Response:
        raw = await request.body()
        try:
            model = json.loads(raw).get("model")
        except (ValueError, AttributeError):
            model = None
        refused = self.refusal(request)
        self.requests.append(
            {
                "path": request.url.path,
                "model": model,
                "headers": {k: v for k, v in request.headers.items() if k in _HEADERS_OF_INTEREST},
                "auth": request.headers.get(self.auth_header),
                "refused": refused,
            }
        )
        if refused is not None:
            return anthropic_error(401, "authentication_error", refused)
        headers = {k: v for k, v in request.headers.items() if k in _FORWARDED}
        headers["accept-encoding"] = "identity"
        if self.upstream_key:
            headers["x-api-key"] = self.upstream_key
        return await relay(
            self.upstream + "/v1/messages", raw, headers,
            lambda why: anthropic_error(502, "api_error", why),
        )  # fmt: skip

    async def _requests(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.requests.clear()
        return JSONResponse(list(self.requests))

    async def _ready(self, request: Request) -> Response:
        return JSONResponse({"ok": True})


def serve_gateway_in_thread(standin: GatewayStandIn) -> RunningApp:
    return serve_in_thread(standin.app, name="gateway-standin")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m corral_dev.providers gateway",
        description="A stand-in for a Messages-compatible gateway (tests only).",
    )
    parser.add_argument("--upstream", required=True, help="a Messages API server's URL")
    parser.add_argument("--key", required=True, help="the key the gateway wants")
    parser.add_argument("--auth-header", default=DEFAULT_AUTH_HEADER)
    parser.add_argument("--auth-scheme", default=DEFAULT_AUTH_SCHEME, help="'' for the key alone")
    parser.add_argument("--upstream-key", default=None, help="x-api-key for the upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    standin = GatewayStandIn(
        args.upstream, key=args.key, auth_header=args.auth_header,
        auth_scheme=args.auth_scheme or None, upstream_key=args.upstream_key,
    )  # fmt: skip
    port = args.port or free_port(args.host)
    line = {
        "url": f"http://{args.host}:{port}",
        "auth_header": standin.auth_header,
        "auth_scheme": standin.auth_scheme,
    }
    return serve_announced(standin.app, args.host, port, line)
