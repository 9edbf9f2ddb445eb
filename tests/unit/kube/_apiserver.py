"""A stand-in API server for corral_kube's tests: aiohttp on 127.0.0.1 (TLS when given a
context), answering each request with the test's handler and recording what it was sent."""

from __future__ import annotations

import json
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    peer_cn: str | None  # the client certificate's common name, when one was presented


def status(code: int, reason: str, message: str) -> web.Response:
    """An error answer as the API server gives it: a Status object."""
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message}  # fmt: skip
    return web.json_response(body, status=code)


def _common_name(peer: dict[str, Any] | None) -> str | None:
    for rdn in (peer or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


async def _ok(_: web.Request) -> web.StreamResponse:
    return web.json_response({"kind": "Pod", "metadata": {"name": "p"}})


@dataclass
class ApiServer:
    tls: ssl.SSLContext | None = None
    handler: Handler = _ok
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def _any(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        self.seen.append(
            Seen(request.method, request.path, dict(request.query), dict(request.headers),
                 await request.read(), _common_name(peer))
        )  # fmt: skip
        return await self.handler(request)

    async def __aenter__(self) -> ApiServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._any)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def watch_lines(*events: dict[str, Any]) -> Handler:
    """A watch that streams `events`, one JSON line each, then ends."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for event in events:
            await response.write(json.dumps(event).encode() + b"\n")
        await response.write_eof()
        return response

    return handler


# ---------------------------------------------------------------------------------- the PKI


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (CN alice)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.ca))
        context.load_cert_chain(str(self.server_cert), str(self.server_key))
        context.verify_mode = ssl.CERT_OPTIONAL  # a client certificate when one is sent
        return context


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(where: Path) -> Pki:
    where.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(where, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=corral-kube-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    for name, cn, ext in (
        ("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "alice", "extendedKeyUsage=clientAuth\n"),
    ):
        (where / f"{name}.ext").write_text(ext)
        _openssl(where, "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}")  # fmt: skip
        _openssl(where, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey",
                 "ca.key", "-CAcreateserial", "-days", "2", "-out", f"{name}.crt",
                 "-extfile", f"{name}.ext")  # fmt: skip
    return Pki(
        where / "ca.crt", where / "server.crt", where / "server.key",
        where / "client.crt", where / "client.key",
    )  # fmt: skip
