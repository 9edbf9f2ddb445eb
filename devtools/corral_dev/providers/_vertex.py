"""A STAND-IN for Google's OAuth 2.0 token endpoint and Google Vertex AI's Claude routes, in one
loopback server for tests. It is not Google: it checks what those endpoints check, with an
implementation that is not Corral's own, and answers from a Messages API server behind it.

- `POST /token`: the service-account JWT grant. The assertion's RS256 signature is verified
  with google-auth against the public half of the key this stand-in generated, with its own
  token URL as the audience; then the grant type, `iss` (the key's client_email), the
  cloud-platform scope and a lifetime of at most an hour. A refusal is Google's
  `400 {"error": "invalid_grant", "error_description": ...}`. It issues random tokens that
  expire after `expires_in` seconds (3599 unless told) and keeps them in its book.
- `POST /v1/projects/P/locations/L/publishers/anthropic/models/ID:streamRawPredict` (and
  `:rawPredict`): only `Authorization: Bearer <a token it issued, unexpired>` passes (else 401
  UNAUTHENTICATED in Google's shape); project, location, publisher and model id are checked
  against its configuration and model map (unknown: 404 NOT_FOUND), the body must carry
  `anthropic_version: vertex-2023-10-16` and no `model`, and its `stream` must fit the route
  (stricter than Vertex, to hold the custodian to the right one). The request goes to the
  upstream's `/v1/messages` with `model` set to the mapped Messages name and
  `anthropic-version: 2023-06-01`; the upstream's SSE is relayed byte for byte, its errors as
  they are.

Test hooks: `POST /_standin/fail` makes the next requests fail (`{"on": "predict"|"token",
"count": N, "status": "RESOURCE_EXHAUSTED", "code": 429, "message": ..., "shape":
"google"|"google-list"|"anthropic", "type": ..., "retry_after": ...}`; for `token`, `status` is
the OAuth error, e.g. invalid_grant), `POST /_standin/revoke` revokes every token issued,
`POST /_standin/config {"expires_in": N}`, `GET /_standin/issued` lists every token issued (a
canary sweep looks for them), `GET`/`DELETE /_standin/requests` what it received.

`main(argv)` (`python -m corral_dev.providers vertex --upstream URL --key-out PATH ...`)
generates an RSA key, writes a service-account key file whose `token_uri` deliberately names
another URL (the custodian must use the platform's `tokenUrl`), and prints
`{"url": ..., "token_url": ..., "key_file": ...}` once it listens. `serve_in_thread` and
`serve_announced` run any of the stand-ins' apps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import exceptions as google_exceptions
from google.auth import jwt as google_jwt
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from corral_common.catalog import models

from ..ports import free_port

DEFAULT_PROJECT = "corral-standin"
DEFAULT_REGION = "us-east5"
# The token_uri written in the generated key: never reachable, never to be used.
KEY_TOKEN_URI = "https://token-uri-in-the-key.invalid/token"
VERTEX_VERSION = "vertex-2023-10-16"
MESSAGES_VERSION = "2023-06-01"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
MAX_ASSERTION_SECONDS = 3600
CLOCK_SKEW_SECONDS = 10
# The HTTP status Google answers each canonical code with.
GOOGLE_CODES: dict[str, int] = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ABORTED": 409,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
_HEADERS_OF_INTEREST = (
    "authorization", "content-type", "accept-encoding", "anthropic-version", "anthropic-beta",
    "x-api-key",
)  # fmt: skip


# ------------------------------------------------------------------------------ the test key


@dataclass(frozen=True)
class StandInServiceAccount:
    """A generated service-account key: the JSON file's fields and the public half."""

    key: dict[str, str] = field(repr=False)
    public_pem: bytes

    @property
    def client_email(self) -> str:
        return self.key["client_email"]

    @property
    def key_id(self) -> str:
        return self.key["private_key_id"]

    def json(self) -> str:
        return json.dumps(self.key, indent=2)


def make_service_account(
    project: str = DEFAULT_PROJECT,
    *,
    client_email: str | None = None,
    token_uri: str = KEY_TOKEN_URI,
) -> StandInServiceAccount:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    key = {
        "type": "service_account",
        "project_id": project,
        "private_key_id": secrets.token_hex(20),
        "private_key": pem,
        "client_email": client_email or f"corral-standin@{project}.iam.gserviceaccount.com",
        "client_id": str(secrets.randbelow(10**20)),
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
    }
    return StandInServiceAccount(key, public)


def catalog_model_map() -> dict[str, str]:
    """Each Vertex id of the shipped catalog, to the entry's Messages API name."""
    out: dict[str, str] = {}
    for info in models().values():
        vertex_id = info.id_for("vertex")
        if vertex_id is not None:
            out.setdefault(vertex_id, info.name)  # the entry's own name comes before aliases
    return out


# --------------------------------------------------------------------------------- answers


def google_error(code: int, status: str, message: str, *, listed: bool = False) -> Response:
    error: Any = {"error": {"code": code, "message": message, "status": status}}
    return JSONResponse([error] if listed else error, status_code=code)


def anthropic_error(code: int, kind: str, message: str) -> Response:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=code)


def oauth_error(code: int, error: str, description: str) -> Response:
    return JSONResponse({"error": error, "error_description": description}, status_code=code)


@dataclass
class Fault:
    """The next `count` requests of kind `on` fail this way."""

    on: str
    count: int
    status: str
    code: int
    message: str
    shape: str = "google"
    kind: str = "api_error"
    retry_after: str | None = None

    @staticmethod
    def parse(data: Mapping[str, Any]) -> Fault:
        on = str(data.get("on", "predict"))
        status = str(data.get("status") or ("invalid_grant" if on == "token" else "INTERNAL"))
        code = int(data.get("code") or GOOGLE_CODES.get(status, 400))
        return Fault(
            on=on,
            count=int(data.get("count", 1)),
            status=status,
            code=code,
            message=str(data.get("message") or f"injected {status}"),
            shape=str(data.get("shape", "google")),
            kind=str(data.get("type", "api_error")),
            retry_after=str(data["retry_after"]) if data.get("retry_after") else None,
        )

    def response(self) -> Response:
        if self.on == "token":
            answer = oauth_error(self.code, self.status, self.message)
        elif self.shape == "anthropic":
            answer = anthropic_error(self.code, self.kind, self.message)
        else:
            listed = self.shape == "google-list"
            answer = google_error(self.code, self.status, self.message, listed=listed)
        if self.retry_after is not None:
            answer.headers["retry-after"] = self.retry_after
        return answer


# ------------------------------------------------------------------------------ the stand-in


class VertexStandIn:
    """Google's token endpoint and Vertex AI, stood in for; `app` is the ASGI app and `url`
    where it is served (the token URL, the JWT's audience, is `url + "/token"`)."""

    def __init__(
        self,
        upstream: str,
        *,
        account: StandInServiceAccount,
        project: str = DEFAULT_PROJECT,
        region: str = DEFAULT_REGION,
        model_map: Mapping[str, str] | None = None,
        expires_in: int = 3599,
        upstream_key: str | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.account = account
        self.project = project
        self.region = region
        self.model_map = dict(catalog_model_map() if model_map is None else model_map)
        self.expires_in = expires_in
        self.upstream_key = upstream_key
        self.url = ""  # set once served
        self.issued: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self._book: dict[str, float] = {}  # token -> when it expires
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        models_path = "/v1/projects/{project}/locations/{location}/publishers/{publisher}/models"
        self.app = Starlette(
            routes=[
                Route("/token", self._token, methods=["POST"]),
                Route(models_path + "/{model_action}", self._predict, methods=["POST"]),
                Route("/_standin/fail", self._fail, methods=["POST"]),
                Route("/_standin/revoke", self._revoke, methods=["POST"]),
                Route("/_standin/config", self._config, methods=["POST"]),
                Route("/_standin/issued", self._issued, methods=["GET"]),
                Route("/_standin/requests", self._requests, methods=["GET", "DELETE"]),
                Route("/readyz", self._ready, methods=["GET"]),
            ]
        )

    @property
    def token_url(self) -> str:
        return self.url + "/token"

    # ------------------------------------------------------------------------- test hooks

    def fail_next(self, **spec: Any) -> None:
        with self._lock:
            self._faults.append(Fault.parse(spec))

    def revoke_all(self) -> None:
        with self._lock:
            self._book.clear()

    def _take_fault(self, on: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.on == on and fault.count > 0:
                    fault.count -= 1
                    return fault
        return None

    async def _fail(self, request: Request) -> Response:
        self.fail_next(**(await request.json()))
        return JSONResponse({"ok": True})

    async def _revoke(self, request: Request) -> Response:
        self.revoke_all()
        return JSONResponse({"ok": True})

    async def _config(self, request: Request) -> Response:
        data = await request.json()
        if "expires_in" in data:
            self.expires_in = int(data["expires_in"])
        return JSONResponse({"expires_in": self.expires_in})

    async def _issued(self, request: Request) -> Response:
        return JSONResponse({"tokens": list(self.issued)})

    async def _requests(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.requests.clear()
        return JSONResponse(list(self.requests))

    async def _ready(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    def _record(self, request: Request, kind: str, **extra: Any) -> dict[str, Any]:
        record = {
            "kind": kind,
            "path": request.url.path,
            "headers": {k: v for k, v in request.headers.items() if k in _HEADERS_OF_INTEREST},
            **extra,
        }
        self.requests.append(record)
        return record

    # --------------------------------------------------------------------- token endpoint

    async def _token(self, request: Request) -> Response:
        raw = (await request.body()).decode("utf-8", "replace")
        form = {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()}
        self._record(request, "token", grant_type=form.get("grant_type"))
        fault = self._take_fault("token")
        if fault is not None:
            return fault.response()
        if not request.headers.get("content-type", "").startswith(
            "application/x-www-form-urlencoded"
        ):
            return oauth_error(400, "invalid_request", "the grant must be a form")
        if form.get("grant_type") != JWT_BEARER:
            return oauth_error(400, "unsupported_grant_type", "Invalid grant_type")
        refused = self._check_assertion(form.get("assertion", ""))
        if refused is not None:
            return oauth_error(400, *refused)
        token = "ya29.standin-" + secrets.token_urlsafe(32)
        with self._lock:
            self._book[token] = time.time() + self.expires_in
            self.issued.append(token)
        return JSONResponse(
            {"access_token": token, "expires_in": self.expires_in, "token_type": "Bearer"}
        )

    def _check_assertion(self, assertion: str) -> tuple[str, str] | None:
        """(error, description) when the JWT grant is refused, as Google words it."""
        try:
            header = google_jwt.decode_header(assertion)  # type: ignore[no-untyped-call]
            claims = google_jwt.decode(  # type: ignore[no-untyped-call]
                assertion,
                certs={self.account.key_id: self.account.public_pem},
                audience=self.token_url,
                clock_skew_in_seconds=CLOCK_SKEW_SECONDS,
            )
        except (google_exceptions.GoogleAuthError, ValueError) as e:
            return "invalid_grant", f"Invalid JWT Signature. ({e})"
        if header.get("alg") != "RS256" or header.get("typ", "JWT") != "JWT":
            return "invalid_grant", "Invalid JWT: the header must be RS256"
        if claims.get("iss") != self.account.client_email:
            return "invalid_grant", "Invalid grant: account not found"
        if CLOUD_PLATFORM not in str(claims.get("scope", "")).split():
            return "invalid_scope", "Invalid OAuth scope or ID token audience provided."
        now = time.time()
        iat, exp = claims.get("iat"), claims.get("exp")
        if not isinstance(iat, int) or not isinstance(exp, int):
            return "invalid_grant", "Invalid JWT: iat and exp must be integers"
        if exp - iat > MAX_ASSERTION_SECONDS or exp > now + MAX_ASSERTION_SECONDS + 60:
            return (
                "invalid_grant",
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a "
                "reasonable timeframe. Check your iat and exp values in the JWT claim.",
            )
        return None

    # ------------------------------------------------------------------------- Vertex AI

    def _authenticated(self, request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        with self._lock:
            expires = self._book.get(token.strip())
        return expires is not None and time.time() < expires

    def _where_refused(self, params: Mapping[str, str]) -> Response | None:
        project, location = params["project"], params["location"]
        model_id, _, action = params["model_action"].rpartition(":")
        name = (
            f"projects/{project}/locations/{location}/publishers/{params['publisher']}"
            f"/models/{model_id}"
        )
        if action not in ("streamRawPredict", "rawPredict"):
            return google_error(404, "NOT_FOUND", f"method {action!r} not found on {name}")
        if project != self.project:
            return google_error(
                403, "PERMISSION_DENIED",
                f"Permission 'aiplatform.endpoints.predict' denied on resource "
                f"'//aiplatform.googleapis.com/{name}' (or it may not exist).",
            )  # fmt: skip
        if (
            location != self.region
            or params["publisher"] != "anthropic"
            or model_id not in self.model_map
        ):
            return google_error(404, "NOT_FOUND", f"Publisher Model `{name}` not found.")
        return None

    async def _predict(self, request: Request) -> Response:
        params = dict(request.path_params)
        model_id, _, action = params["model_action"].rpartition(":")
        raw = await request.body()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        self._record(request, "predict", model=model_id, action=action, body=body)
        if not self._authenticated(request):
            return google_error(
                401, "UNAUTHENTICATED",
                "Request had invalid authentication credentials. Expected OAuth 2 access "
                "token, login cookie or other valid authentication credential.",
            )  # fmt: skip
        fault = self._take_fault("predict")
        if fault is not None:
            return fault.response()
        refused = self._where_refused(params)
        if refused is not None:
            return refused
        if not isinstance(body, dict):
            return google_error(400, "INVALID_ARGUMENT", "the request body is not a JSON object")
        if body.get("anthropic_version") != VERTEX_VERSION:
            return anthropic_error(
                400,
                "invalid_request_error",
                f"anthropic_version: Input should be {VERTEX_VERSION!r}",
            )
        if "model" in body:
            return anthropic_error(
                400, "invalid_request_error", "model: Extra inputs are not permitted"
            )
        if bool(body.get("stream")) != (action == "streamRawPredict"):
            return google_error(
                400, "INVALID_ARGUMENT", f"{action} wants stream {action == 'streamRawPredict'}"
            )
        return await self._forward(body, self.model_map[model_id], request)

    async def _forward(self, body: dict[str, Any], name: str, request: Request) -> Response:
        sent = {"model": name, **{k: v for k, v in body.items() if k != "anthropic_version"}}
        headers = {
            "content-type": "application/json",
            "anthropic-version": MESSAGES_VERSION,
            "accept-encoding": "identity",
        }
        if request.headers.get("anthropic-beta"):
            headers["anthropic-beta"] = request.headers["anthropic-beta"]
        if self.upstream_key:
            headers["x-api-key"] = self.upstream_key
        return await relay(
            self.upstream + "/v1/messages", json.dumps(sent).encode(), headers,
            lambda why: google_error(503, "UNAVAILABLE", why),
        )  # fmt: skip


async def relay(
    url: str,
    content: bytes,
    headers: Mapping[str, str],
    unreachable: Callable[[str], Response],
) -> Response:
    """POST to a Messages API and answer what it answers: its SSE byte for byte as it comes,
    anything else whole; `unreachable(why)` when it cannot be reached."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0))
    try:
        request = client.build_request("POST", url, content=content, headers=dict(headers))
        response = await client.send(request, stream=True)
    except httpx.HTTPError as e:
        await client.aclose()
        return unreachable(f"the model upstream is unreachable: {e}")
    content_type = response.headers.get("content-type", "application/json")
    if response.status_code == 200 and content_type.startswith("text/event-stream"):
        return StreamingResponse(_pieces(client, response), media_type="text/event-stream")
    try:
        data = await response.aread()
    finally:
        await response.aclose()
        await client.aclose()
    # A gateway (and Vertex, for the model's own errors) passes the retry advice on.
    kept = {k: v for k, v in response.headers.items() if k.lower() in _RETRY_HEADERS}
    return Response(data, status_code=response.status_code, media_type=content_type, headers=kept)


_RETRY_HEADERS = frozenset({"retry-after", "retry-after-ms", "x-should-retry", "request-id"})


async def _pieces(client: httpx.AsyncClient, response: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    finally:
        await response.aclose()
        await client.aclose()


# ---------------------------------------------------------------------------- running one


@dataclass
class RunningApp:
    """A stand-in served on a thread of this process (tests): `stop()` ends it."""

    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


def serve_in_thread(app: Any, *, name: str, host: str = "127.0.0.1") -> RunningApp:
    port = free_port(host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    for _ in range(1000):
        if server.started:
            return RunningApp(f"http://{host}:{port}", server, thread)
        if not thread.is_alive():
            break
        time.sleep(0.01)
    server.should_exit = True
    raise RuntimeError(f"the {name} stand-in did not start")


def serve_vertex_in_thread(standin: VertexStandIn) -> RunningApp:
    """`standin` on a thread of this process, its `url` set (the JWT's audience needs it)."""
    running = serve_in_thread(standin.app, name="vertex-standin")
    standin.url = running.url
    return running


def serve_announced(app: Any, host: str, port: int, line: Mapping[str, Any]) -> int:
    """Serve `app` until stopped, printing `line` as JSON once it listens (a test reads it)."""
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    )

    async def run() -> None:
        serving = asyncio.ensure_future(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started:
            print(json.dumps(dict(line)), flush=True)
        await serving

    asyncio.run(run())
    return 0 if server.started else 1


def parse_model_map(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        vertex_id, sep, name = pair.partition("=")
        if not sep or not vertex_id or not name:
            raise argparse.ArgumentTypeError(f"--model wants VERTEX_ID=MESSAGES_NAME, not {pair!r}")
        out[vertex_id] = name
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m corral_dev.providers vertex",
        description="A stand-in for Google's token endpoint and Vertex AI (tests only).",
    )
    parser.add_argument("--upstream", required=True, help="a Messages API server's URL")
    parser.add_argument("--project", default=DEFAULT_PROJECT)
    parser.add_argument("--region", default=DEFAULT_REGION)
    parser.add_argument("--key-out", required=True, help="where to write the service-account key")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--expires-in", type=int, default=3599, help="issued tokens' lifetime")
    parser.add_argument("--upstream-key", default=None, help="x-api-key for the upstream")
    parser.add_argument(
        "--model", action="append", default=[], metavar="VERTEX_ID=MESSAGES_NAME",
        help="the model map (default: the shipped catalog's Vertex ids)",
    )  # fmt: skip
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        model_map = parse_model_map(args.model) if args.model else None
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    account = make_service_account(args.project)
    key_file = Path(args.key_out)
    key_file.write_text(account.json())
    key_file.chmod(0o600)
    standin = VertexStandIn(
        args.upstream, account=account, project=args.project, region=args.region,
        model_map=model_map, expires_in=args.expires_in, upstream_key=args.upstream_key,
    )  # fmt: skip
    port = args.port or free_port(args.host)
    standin.url = f"http://{args.host}:{port}"
    line = {"url": standin.url, "token_url": standin.token_url, "key_file": str(key_file)}
    return serve_announced(standin.app, args.host, port, line)
