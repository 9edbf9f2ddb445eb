"""A STAND-IN for Amazon Bedrock's runtime and AWS STS, in one loopback server, for tests: it is
not AWS and is not Corral's own code; it checks what the real endpoints check, with
implementations of its own, and answers from a Messages API server behind it (the scripted
model).

Bedrock (`POST /model/<id>/invoke` and `/invoke-with-response-stream`):
- every SigV4 signature is recomputed with botocore (service `bedrock`, the stand-in's
  region, the request's own `x-amz-date`); only the configured key and keys this stand-in's
  STS issued (unexpired, with their session token) are accepted;
- the model id must be in its map (with or without the region's geography prefix), the body
  must carry `anthropic_version: bedrock-2023-05-31` and no `model` or `stream`;
- the body goes to `<upstream>/v1/messages` with the mapped model, `stream`, and the body's
  `anthropic_beta` as the `anthropic-beta` header; a streamed answer's SSE events come back as
  event-stream `chunk` frames (its own encoder), each the event's JSON as base64; an upstream
  error comes back in Bedrock's shape (`x-amzn-errortype`, `{"message": ...}`).

STS (`POST /` with a form `Action`): `AssumeRoleWithWebIdentity` reads the token as a JWT and
checks its `aud` holds `sts.amazonaws.com` and its `exp` (it does NOT verify the token's
signature: a stand-in has no cluster's keys); `AssumeRole` verifies the SigV4 signature
(service `sts`). Either checks the role (`--role-arn`, when given) and issues random keys
(`ASIA...`, a secret, a session token, an expiry `--lifetime` seconds ahead) into the key book
the Bedrock side accepts, answered in STS's XML.

Test hooks: `GET /_standin/issued` (every key it minted: the canary sweep's list),
`GET /_standin/requests` (the translated requests it forwarded), `GET /_standin/sts` (the STS
exchanges), `POST /_standin/faults` (a fault, or a list, for the next requests: see `Fault`),
`DELETE /_standin/faults`, `POST /_standin/expire` (every issued key expires now).

`python -m corral_dev.providers bedrock --upstream URL [--region R] [--access-key K]
[--secret-key S] [--session-token T] [--role-arn ARN ...] [--model ID=NAME ...] [--lifetime N]
[--host H] [--port N]` prints one JSON line once it listens: url, sts_url, region,
access_key_id, secret_access_key, session_token, role_arns, models.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import re
import secrets
import socket
import string
import struct
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ElementTree
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, unquote

import httpx
import uvicorn
from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
from botocore.credentials import Credentials  # type: ignore[import-untyped]
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from corral_common.catalog import models as catalog_models

ANTHROPIC_VERSION = "bedrock-2023-05-31"
MESSAGES_VERSION = "2023-06-01"
STS_AUDIENCE = "sts.amazonaws.com"
STS_NAMESPACE = "https://sts.amazonaws.com/doc/2011-06-15/"
SIGNATURE_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. Check your "
    "AWS Secret Access Key and signing method. Consult the service documentation for details."
)
INVALID_MODEL = "The provided model identifier is invalid."
_ERROR_NAMESPACE = "http://internal.amazon.com/coral/com.amazon.bedrock/"
_AUTHORIZATION = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=([^/,\s]+)/(\d{8})/([^/,\s]+)/([^/,\s]+)/aws4_request,\s*"
    r"SignedHeaders=([a-z0-9;-]+),\s*Signature=([0-9a-f]{64})$"
)
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$")
_SESSION_NAME = re.compile(r"^[\w+=,.@-]{2,64}$", re.ASCII)
# The geographies of cross-region inference profiles and the regions that have each.
_GEOGRAPHY_REGIONS: dict[str, tuple[str, ...]] = {
    "us": ("us-east-", "us-west-", "ca-"),
    "us-gov": ("us-gov-",),
    "eu": ("eu-",),
    "apac": ("ap-",),
    "global": ("",),
}
# The Bedrock exception a signature failure is, and what STS calls the same failure.
_STS_CODES = {
    "MissingAuthenticationTokenException": "MissingAuthenticationToken",
    "IncompleteSignatureException": "IncompleteSignature",
    "UnrecognizedClientException": "InvalidClientTokenId",
    "ExpiredTokenException": "ExpiredToken",
    "InvalidSignatureException": "SignatureDoesNotMatch",
}
# An upstream (Messages API) error type -> Bedrock's status and exception.
_FROM_ANTHROPIC: dict[str, tuple[int, str]] = {
    "invalid_request_error": (400, "ValidationException"),
    "request_too_large": (400, "ValidationException"),
    "permission_error": (403, "AccessDeniedException"),
    "not_found_error": (404, "ResourceNotFoundException"),
    "rate_limit_error": (429, "ThrottlingException"),
    "overloaded_error": (503, "ServiceUnavailableException"),
}
# ... and mid-stream, as an exception frame's type.
_STREAM_FROM_ANTHROPIC = {
    "rate_limit_error": "throttlingException",
    "overloaded_error": "serviceUnavailableException",
    "invalid_request_error": "validationException",
}


# ---------------------------------------------------------------- the event-stream encoding


def encode_header(name: str, value: bool | int | bytes | str, kind: int | None = None) -> bytes:
    """One header: name length (u8), name, type (u8), value. `kind` picks a numeric type
    (2 byte, 3 int16, 4 int32, 5 int64, 8 timestamp) or 9 (a 16-byte UUID); by default a
    bool is 0/1, an int an int32, bytes 6, a str 7."""
    raw_name = name.encode("utf-8")
    head = struct.pack(">B", len(raw_name)) + raw_name
    if isinstance(value, bool):
        return head + struct.pack(">B", 0 if value else 1)
    if isinstance(value, int):
        kind = kind or 4
        fmt = {2: ">b", 3: ">h", 4: ">i", 5: ">q", 8: ">q"}[kind]
        return head + struct.pack(">B", kind) + struct.pack(fmt, value)
    if isinstance(value, bytes) and kind == 9:
        assert len(value) == 16, "a UUID header is 16 bytes"
        return head + struct.pack(">B", 9) + value
    raw = value if isinstance(value, bytes) else value.encode("utf-8")
    return head + struct.pack(">BH", 6 if isinstance(value, bytes) else 7, len(raw)) + raw


def encode_message(headers: Sequence[bytes], payload: bytes) -> bytes:
    """A whole message: prelude and its CRC, the encoded headers, the payload, the CRC."""
    head = b"".join(headers)
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + head + payload
    return body + struct.pack(">I", zlib.crc32(body))


def chunk_frame(event: bytes) -> bytes:
    """A Messages event as Bedrock streams it: a `chunk` holding the event's JSON in base64."""
    payload = json.dumps({"bytes": base64.b64encode(event).decode("ascii")}).encode()
    headers = [
        encode_header(":event-type", "chunk"),
        encode_header(":content-type", "application/json"),
        encode_header(":message-type", "event"),
    ]
    return encode_message(headers, payload)


def exception_frame(exception_type: str, message: str) -> bytes:
    headers = [
        encode_header(":exception-type", exception_type),
        encode_header(":content-type", "application/json"),
        encode_header(":message-type", "exception"),
    ]
    return encode_message(headers, json.dumps({"message": message}).encode())


# ------------------------------------------------------------------------- the stand-in's state


@dataclass
class Key:
    access_key_id: str
    secret_access_key: str
    session_token: str | None
    expires_at: float | None  # None: the configured key, which does not expire
    issued_by: str  # "configured", "AssumeRole" or "AssumeRoleWithWebIdentity"


@dataclass
class Fault:
    """What the next request(s) meet instead of the ordinary answer.

    kind: `error` (Bedrock refuses with `status` and the exception `type` before anything is
    forwarded), `exception_frame` (a stream sends `after_events` chunks, then an exception
    frame of `type`, lower camel case, e.g. throttlingException), `cut` (after `after_events`
    chunks, half a frame and the connection is dropped), `truncate` (half a frame and the
    stream ends cleanly), `bad_crc` (a frame whose message CRC is wrong), `sts_error` (STS
    refuses with `status` and the code `type`). `count`: how many requests it applies to.
    """

    kind: str
    status: int = 500
    type: str = "InternalServerException"
    message: str = "injected by the Bedrock stand-in"
    after_events: int = 0
    count: int = 1


STREAM_FAULTS = ("exception_frame", "cut", "truncate", "bad_crc")
FAULT_KINDS = ("error", "sts_error", *STREAM_FAULTS)


@dataclass(frozen=True)
class Refused:
    """An authentication failure, as Bedrock's exception type (STS's code: `_STS_CODES`)."""

    status: int
    type: str
    message: str


class _CutConnection(Exception):
    """Raised inside a streamed answer so the server drops the connection mid-frame."""


@dataclass
class BedrockStandIn:
    upstream: str
    region: str = "us-east-1"
    access_key_id: str = "AKIASTANDINEXAMPLE01"
    secret_access_key: str = field(default_factory=lambda: secrets.token_urlsafe(30))
    session_token: str | None = None
    role_arns: tuple[str, ...] = ()
    # Bedrock model id (without a geography prefix, or with one) -> the Messages API's name.
    models: dict[str, str] = field(default_factory=lambda: catalog_model_map())
    lifetime: int = 3600  # seconds the keys STS issues last at most
    # What it did, for the tests (the hooks serve them).
    forwarded: list[dict[str, Any]] = field(default_factory=list)
    sts_calls: list[dict[str, Any]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    keys: dict[str, Key] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.upstream = self.upstream.rstrip("/")
        self.keys[self.access_key_id] = Key(
            self.access_key_id, self.secret_access_key, self.session_token, None, "configured"
        )
        self.app = Starlette(
            routes=[
                Route("/", self._sts, methods=["POST"]),
                Route("/model/{rest:path}", self._runtime, methods=["POST"]),
                Route("/_standin/issued", self._issued, methods=["GET"]),
                Route("/_standin/requests", self._requests, methods=["GET"]),
                Route("/_standin/sts", self._sts_log, methods=["GET"]),
                Route("/_standin/faults", self._faults, methods=["POST", "DELETE"]),
                Route("/_standin/expire", self._expire, methods=["POST"]),
            ]
        )

    # ------------------------------------------------------------------------------ hooks

    def add_fault(self, fault: Fault) -> None:
        if fault.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {fault.kind!r} (known: {FAULT_KINDS})")
        self.faults.append(fault)

    def take_fault(self, kinds: Sequence[str]) -> Fault | None:
        for fault in self.faults:
            if fault.kind in kinds:
                fault.count -= 1
                if fault.count <= 0:
                    self.faults.remove(fault)
                return fault
        return None

    def issued(self) -> list[Key]:
        # A copy first: the server's thread may be adding to the book while a test reads it.
        return [k for k in list(self.keys.values()) if k.issued_by != "configured"]

    def expire_issued(self) -> None:
        for key in self.issued():
            key.expires_at = time.time() - 1

    async def _issued(self, request: Request) -> Response:
        keys = self.issued()
        values = [v for k in keys for v in (k.secret_access_key, k.session_token) if v]
        return JSONResponse({"credentials": [asdict(k) for k in keys], "values": values})

    async def _requests(self, request: Request) -> Response:
        return JSONResponse(self.forwarded)

    async def _sts_log(self, request: Request) -> Response:
        return JSONResponse(self.sts_calls)

    async def _faults(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.faults.clear()
            return JSONResponse({"cleared": True})
        data = await request.json()
        try:
            for item in data if isinstance(data, list) else [data]:
                self.add_fault(Fault(**item))
        except (TypeError, ValueError) as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return JSONResponse({"faults": len(self.faults)})

    async def _expire(self, request: Request) -> Response:
        self.expire_issued()
        return JSONResponse({"expired": len(self.issued())})

    # ---------------------------------------------------------------------- authentication

    def authenticate(self, request: Request, body: bytes, service: str) -> Key | Refused:
        """The key that signed `request`, or why it is refused, as AWS decides it."""
        authorization = request.headers.get("authorization")
        if not authorization:
            return Refused(
                403, "MissingAuthenticationTokenException", "Missing Authentication Token"
            )
        match = _AUTHORIZATION.match(authorization)
        if match is None:
            return Refused(
                400, "IncompleteSignatureException",
                "Authorization header requires 'Credential', 'Signature', 'SignedHeaders' "
                "parameters.",
            )  # fmt: skip
        access_key, day, region, scope_service, signed, signature = match.groups()
        amz_date = request.headers.get("x-amz-date", "")
        problem = _scope_problem(amz_date, day, region, scope_service, self.region, service)
        if problem is not None:
            return problem
        names = signed.split(";")
        if "host" not in names or any(n not in request.headers for n in names):
            return Refused(403, "InvalidSignatureException", SIGNATURE_MISMATCH)
        key = self.keys.get(access_key)
        if key is None or key.session_token != request.headers.get("x-amz-security-token"):
            return Refused(
                403, "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            )  # fmt: skip
        if key.session_token is not None and "x-amz-security-token" not in names:
            return Refused(403, "InvalidSignatureException", SIGNATURE_MISMATCH)
        if key.expires_at is not None and time.time() >= key.expires_at:
            return Refused(
                403,
                "ExpiredTokenException",
                "The security token included in the request is expired",
            )
        declared = request.headers.get("x-amz-content-sha256")
        if declared is not None and declared != hashlib.sha256(body).hexdigest():
            return Refused(400, "InvalidSignatureException", "The provided payload hash is wrong.")
        headers = {name: request.headers[name] for name in names}
        expected = botocore_signature(
            request, body, headers, key, region=self.region, service=service, amz_date=amz_date
        )
        if not hmac.compare_digest(expected, signature):
            return Refused(403, "InvalidSignatureException", SIGNATURE_MISMATCH)
        return key

    # ----------------------------------------------------------------------------- Bedrock

    async def _runtime(self, request: Request) -> Response:
        parts = request.scope["raw_path"].decode("latin-1").split("/")
        if len(parts) != 4 or parts[3] not in ("invoke", "invoke-with-response-stream"):
            return bedrock_error(404, "UnknownOperationException", "Unknown operation")
        streamed = parts[3] == "invoke-with-response-stream"
        body = await request.body()
        key = self.authenticate(request, body, "bedrock")
        if isinstance(key, Refused):
            return bedrock_error(key.status, key.type, key.message)
        refusal = self.take_fault(["error"])
        if refusal is not None:
            return bedrock_error(refusal.status, refusal.type, refusal.message)
        model_id = unquote(parts[2])
        name = self.messages_model(model_id)
        if name is None:
            return bedrock_error(400, "ValidationException", INVALID_MODEL)
        checked = _checked_body(body)
        if isinstance(checked, Response):
            return checked
        betas = checked.pop("anthropic_beta", None)
        del checked["anthropic_version"]
        forwarded = {**checked, "model": name, "stream": streamed}
        headers = {"anthropic-version": MESSAGES_VERSION, "content-type": "application/json"}
        if betas:
            headers["anthropic-beta"] = ",".join(betas)
        self.forwarded.append(
            {"path": "/".join(parts), "operation": parts[3], "model_id": model_id,
             "messages_model": name, "anthropic_beta": betas, "access_key_id": key.access_key_id,
             "issued_by": key.issued_by, "body": forwarded}
        )  # fmt: skip
        client = httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=10.0))
        try:
            upstream = await client.send(
                client.build_request(
                    "POST", self.upstream + "/v1/messages", json=forwarded, headers=headers
                ),
                stream=True,
            )
        except httpx.HTTPError as e:
            await client.aclose()
            return bedrock_error(500, "InternalServerException", f"upstream unreachable: {e}")
        if upstream.status_code != 200 or not streamed:
            try:
                data = await upstream.aread()
            finally:
                await upstream.aclose()
                await client.aclose()
            return _answer_whole(upstream.status_code, data)
        relay = self._relay(client, upstream, self.take_fault(STREAM_FAULTS))
        return StreamingResponse(
            relay, media_type="application/vnd.amazon.eventstream",
            headers={"x-amzn-requestid": str(uuid.uuid4()),
                     "x-amzn-bedrock-content-type": "application/json"},
        )  # fmt: skip

    def messages_model(self, model_id: str) -> str | None:
        """The Messages API's name for a Bedrock id, with or without the region's geography."""
        if model_id in self.models:
            return self.models[model_id]
        geography, _, rest = model_id.partition(".")
        regions = _GEOGRAPHY_REGIONS.get(geography)
        if regions is None or not self.region.startswith(regions) or rest not in self.models:
            return None
        return self.models[rest]

    async def _relay(
        self, client: httpx.AsyncClient, upstream: httpx.Response, fault: Fault | None
    ) -> AsyncIterator[bytes]:
        """The upstream's SSE events as event-stream frames, with the fault (if any) after
        `fault.after_events` chunks."""
        started = time.monotonic()
        usage: dict[str, int] = {}
        sent = 0
        try:
            async for kind, data in sse_events(upstream):
                if fault is not None and sent == fault.after_events:
                    for piece in _fault_frames(fault, data):
                        yield piece
                    if fault.kind == "cut":
                        raise _CutConnection("the stand-in drops the connection mid-frame")
                    return
                if kind == "ping":
                    continue  # Bedrock's stream carries no pings
                if kind == "error":
                    yield _upstream_error_frame(data)
                    return
                if kind == "message_stop":
                    data = _with_metrics(data, usage, started)
                _count_usage(kind, data, usage)
                yield chunk_frame(data)
                sent += 1
            if fault is not None:  # fewer events than it was to come after: at the end
                for piece in _fault_frames(fault, b'{"type": "ping"}'):
                    yield piece
                if fault.kind == "cut":
                    raise _CutConnection("the stand-in drops the connection mid-frame")
        finally:
            await upstream.aclose()
            await client.aclose()

    # --------------------------------------------------------------------------------- STS

    async def _sts(self, request: Request) -> Response:
        body = await request.body()
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"), True).items()}
        action = form.get("Action", "")
        if form.get("Version") != "2011-06-15":
            return sts_error(400, "InvalidParameterValue", "Version must be 2011-06-15")
        caller: Key | None = None
        if action == "AssumeRole":
            key = self.authenticate(request, body, "sts")
            if isinstance(key, Refused):
                return sts_error(key.status, _STS_CODES.get(key.type, key.type), key.message)
            caller = key
        elif action != "AssumeRoleWithWebIdentity":
            return sts_error(400, "InvalidAction", f"Could not find operation {action!r}")
        fault = self.take_fault(["sts_error"])
        if fault is not None:
            return sts_error(fault.status, fault.type, fault.message)
        problem = self._role_problem(form, caller)
        if problem is not None:
            return problem
        subject = None
        if action == "AssumeRoleWithWebIdentity":
            claims = jwt_claims(form.get("WebIdentityToken", ""))
            if isinstance(claims, Response):
                return claims
            subject = str(claims.get("sub", ""))
        duration = min(int(form.get("DurationSeconds") or 3600), self.lifetime)
        key = self._issue(action, duration)
        self.sts_calls.append(
            {"action": action, "role_arn": form["RoleArn"],
             "session_name": form["RoleSessionName"], "subject": subject,
             "token": form.get("WebIdentityToken"),
             "caller": caller.access_key_id if caller else None,
             "issued": key.access_key_id}
        )  # fmt: skip
        return sts_answer(action, form["RoleArn"], form["RoleSessionName"], key, subject)

    def _role_problem(self, form: dict[str, str], caller: Key | None) -> Response | None:
        role = form.get("RoleArn", "")
        action = form.get("Action", "")
        if not _ROLE_ARN.match(role):
            return sts_error(400, "ValidationError", f"{role!r} is not a role ARN")
        if not _SESSION_NAME.match(form.get("RoleSessionName", "")):
            return sts_error(
                400, "ValidationError",
                "1 validation error detected: Value at 'roleSessionName' failed to satisfy "
                "constraint: Member must satisfy regular expression pattern: [\\w+=,.@-]*",
            )  # fmt: skip
        duration = form.get("DurationSeconds") or "3600"
        if not duration.isdigit() or not 900 <= int(duration) <= 43200:
            return sts_error(400, "ValidationError", "DurationSeconds must be 900 to 43200")
        if caller is not None and caller.issued_by != "configured" and int(duration) > 3600:
            return sts_error(
                400, "ValidationError",
                "The requested DurationSeconds exceeds the 1 hour session limit for roles "
                "assumed by role chaining.",
            )  # fmt: skip
        if self.role_arns and role not in self.role_arns:
            return sts_error(403, "AccessDenied", f"Not authorized to perform sts:{action}")
        return None

    def _issue(self, action: str, duration: int) -> Key:
        suffix = "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(16))
        key = Key(
            access_key_id="ASIA" + suffix,
            secret_access_key=secrets.token_urlsafe(30),
            session_token="IQoJb3JpZ2luX2VjE" + secrets.token_urlsafe(120),
            expires_at=float(int(time.time()) + duration),
            issued_by=action,
        )
        self.keys[key.access_key_id] = key
        return key


# ------------------------------------------------------------------------------- the pieces


def catalog_model_map() -> dict[str, str]:
    """The shipped catalog's Bedrock ids -> the Messages API's names (an entry's name, which
    the catalog lists before its aliases)."""
    out: dict[str, str] = {}
    for info in catalog_models().values():
        model_id = info.id_for("bedrock")
        if model_id is not None:
            out.setdefault(model_id, info.name)
    return out


def _scope_problem(
    amz_date: str, day: str, region: str, scope_service: str, own_region: str, service: str
) -> Refused | None:
    if not re.fullmatch(r"\d{8}T\d{6}Z", amz_date) or amz_date[:8] != day:
        return Refused(
            400, "IncompleteSignatureException",
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date "
            "from HTTP",
        )  # fmt: skip
    signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    if abs(time.time() - signed_at) > 300:
        return Refused(403, "InvalidSignatureException", f"Signature expired: {amz_date}")
    if region != own_region:
        return Refused(
            403, "InvalidSignatureException",
            f"Credential should be scoped to a valid region, not '{region}'.",
        )  # fmt: skip
    if scope_service != service:
        return Refused(
            403, "InvalidSignatureException",
            f"Credential should be scoped to correct service: '{service}'.",
        )  # fmt: skip
    return None


def botocore_signature(
    request: Request,
    body: bytes,
    headers: dict[str, str],
    key: Key,
    *,
    region: str,
    service: str,
    amz_date: str,
) -> str:
    """The signature botocore computes for this request, at the request's own date (not
    `add_auth`, which signs at the current time)."""
    query = request.scope.get("query_string", b"").decode("latin-1")
    url = f"http://{request.headers['host']}{request.scope['raw_path'].decode('latin-1')}"
    aws_request = AWSRequest(
        method=request.method, url=url + (f"?{query}" if query else ""), headers=headers,
        data=body,
    )  # fmt: skip
    aws_request.context["timestamp"] = amz_date
    signer = SigV4Auth(
        Credentials(key.access_key_id, key.secret_access_key, key.session_token), service, region
    )
    canonical = signer.canonical_request(aws_request)
    to_sign = signer.string_to_sign(aws_request, canonical)
    return str(signer.signature(to_sign, aws_request))


def bedrock_error(status: int, error_type: str, message: str) -> Response:
    return JSONResponse(
        {"message": message},
        status_code=status,
        headers={
            "x-amzn-errortype": f"{error_type}:{_ERROR_NAMESPACE}",
            "x-amzn-requestid": str(uuid.uuid4()),
        },
    )


def _checked_body(body: bytes) -> dict[str, Any] | Response:
    try:
        data = json.loads(body)
    except ValueError:
        return bedrock_error(400, "ValidationException", "Malformed input request: not JSON")
    if not isinstance(data, dict):
        return bedrock_error(400, "ValidationException", "Malformed input request")
    for extraneous in ("model", "stream"):
        if extraneous in data:
            return bedrock_error(
                400, "ValidationException",
                f"Malformed input request: extraneous key [{extraneous}] is not permitted",
            )  # fmt: skip
    if data.get("anthropic_version") != ANTHROPIC_VERSION:
        return bedrock_error(
            400, "ValidationException",
            f"Malformed input request: anthropic_version must be {ANTHROPIC_VERSION}",
        )  # fmt: skip
    betas = data.get("anthropic_beta")
    if betas is not None and (
        not isinstance(betas, list) or not all(isinstance(b, str) for b in betas)
    ):
        return bedrock_error(400, "ValidationException", "anthropic_beta must be a list of str")
    return data


def _anthropic_error(data: bytes) -> tuple[str, str]:
    try:
        error = json.loads(data)["error"]
        return str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        return "api_error", data.decode("utf-8", "replace")[:300]


def _answer_whole(status: int, data: bytes) -> Response:
    if status == 200:
        return Response(
            data, media_type="application/json",
            headers={"x-amzn-requestid": str(uuid.uuid4())},
        )  # fmt: skip
    kind, message = _anthropic_error(data)
    bedrock_status, exception = _FROM_ANTHROPIC.get(kind, (500, "InternalServerException"))
    return bedrock_error(bedrock_status, exception, message)


def _upstream_error_frame(data: bytes) -> bytes:
    kind, message = _anthropic_error(data)
    return exception_frame(_STREAM_FROM_ANTHROPIC.get(kind, "modelStreamErrorException"), message)


def _fault_frames(fault: Fault, event: bytes) -> list[bytes]:
    frame = chunk_frame(event)
    if fault.kind == "exception_frame":
        return [exception_frame(fault.type, fault.message)]
    if fault.kind in ("cut", "truncate"):
        return [frame[: len(frame) // 2]]
    # bad_crc: the last byte of the message CRC flipped
    return [frame[:-1] + bytes([frame[-1] ^ 0xFF])]


def _count_usage(kind: str, data: bytes, usage: dict[str, int]) -> None:
    try:
        event = json.loads(data)
    except ValueError:
        return
    found = event.get("message", {}).get("usage") if kind == "message_start" else None
    found = event.get("usage") if kind == "message_delta" else found
    if isinstance(found, dict):
        for name, value in found.items():
            if isinstance(value, int):
                usage[name] = value


def _with_metrics(data: bytes, usage: dict[str, int], started: float) -> bytes:
    """message_stop as Bedrock sends it: with its invocation metrics."""
    event = json.loads(data)
    elapsed = int((time.monotonic() - started) * 1000)
    event["amazon-bedrock-invocationMetrics"] = {
        "inputTokenCount": usage.get("input_tokens", 0),
        "outputTokenCount": usage.get("output_tokens", 0),
        "invocationLatency": elapsed,
        "firstByteLatency": elapsed,
    }
    return json.dumps(event, separators=(",", ":")).encode()


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, bytes]]:
    """A plain SSE reader: (event, data) for each event, data lines joined by newlines."""
    kind, data = "", list[str]()
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield kind or "message", "\n".join(data).encode()
            kind, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            kind = value
        elif name == "data":
            data.append(value)
    if data:
        yield kind or "message", "\n".join(data).encode()


def jwt_claims(token: str) -> dict[str, Any] | Response:
    """The token's claims, checked for STS's audience and expiry. Its signature is NOT
    verified: a stand-in has no cluster's signing keys."""
    parts = token.split(".")
    try:
        if len(parts) != 3:
            raise ValueError("not three parts")
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = json.loads(payload)
        if not isinstance(claims, dict):
            raise ValueError("the claims are not an object")
    except ValueError as e:
        return sts_error(400, "InvalidIdentityToken", f"The web identity token is not a JWT: {e}")
    audience = claims.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    if STS_AUDIENCE not in audiences:
        return sts_error(400, "InvalidIdentityToken", "Incorrect token audience")
    expires = claims.get("exp")
    if isinstance(expires, int | float) and expires <= time.time():
        return sts_error(400, "ExpiredTokenException", "Token expired: the exp claim has passed")
    return claims


def _xml(parent: ElementTree.Element, tag: str, text: str | None = None) -> ElementTree.Element:
    element = ElementTree.SubElement(parent, tag)
    if text is not None:
        element.text = text
    return element


def sts_answer(action: str, role: str, session: str, key: Key, subject: str | None) -> Response:
    root = ElementTree.Element(f"{action}Response", xmlns=STS_NAMESPACE)
    result = _xml(root, f"{action}Result")
    if subject is not None:
        _xml(result, "SubjectFromWebIdentityToken", subject)
        _xml(result, "Audience", STS_AUDIENCE)
    user = _xml(result, "AssumedRoleUser")
    account, role_name = role.split(":")[4], role.rpartition("/")[2]
    _xml(user, "Arn", f"arn:aws:sts::{account}:assumed-role/{role_name}/{session}")
    _xml(user, "AssumedRoleId", f"AROASTANDIN{account}:{session}")
    credentials = _xml(result, "Credentials")
    _xml(credentials, "SessionToken", key.session_token)
    _xml(credentials, "SecretAccessKey", key.secret_access_key)
    expires = datetime.fromtimestamp(key.expires_at or 0, UTC)
    _xml(credentials, "Expiration", expires.strftime("%Y-%m-%dT%H:%M:%SZ"))
    _xml(credentials, "AccessKeyId", key.access_key_id)
    _xml(_xml(root, "ResponseMetadata"), "RequestId", str(uuid.uuid4()))
    return Response(ElementTree.tostring(root), media_type="text/xml")


def sts_error(status: int, code: str, message: str) -> Response:
    root = ElementTree.Element("ErrorResponse", xmlns=STS_NAMESPACE)
    error = _xml(root, "Error")
    _xml(error, "Type", "Sender" if status < 500 else "Receiver")
    _xml(error, "Code", code)
    _xml(error, "Message", message)
    _xml(root, "RequestId", str(uuid.uuid4()))
    return Response(ElementTree.tostring(root), status_code=status, media_type="text/xml")


# ---------------------------------------------------------------------------- running it


def bind(host: str, port: int) -> socket.socket:
    """A listening socket of its own: with port 0 the kernel picks one, and it is held."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def _url(host: str, sock: socket.socket) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{sock.getsockname()[1]}"


@dataclass
class RunningStandIn:
    url: str
    standin: BedrockStandIn
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


def serve_in_thread(
    standin: BedrockStandIn, host: str = "127.0.0.1", port: int = 0
) -> RunningStandIn:
    """Serve the stand-in from a background thread of this process (the unit tests)."""
    sock = bind(host, port)
    config = uvicorn.Config(standin.app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="bedrock-standin", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the Bedrock stand-in did not start")
        time.sleep(0.01)
    return RunningStandIn(_url(host, sock), standin, server, thread)


def _model_pair(text: str) -> tuple[str, str]:
    model_id, sep, name = text.partition("=")
    if not sep or not model_id or not name:
        raise argparse.ArgumentTypeError(f"--model wants BEDROCK_ID=MESSAGES_NAME, not {text!r}")
    return model_id, name


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m corral_dev.providers bedrock",
        description="A stand-in for Amazon Bedrock's runtime and AWS STS, for tests.",
    )
    parser.add_argument("--upstream", required=True, help="a Messages API server's URL")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--access-key", default="AKIASTANDINEXAMPLE01")
    parser.add_argument("--secret-key", default=None, help="default: a random one, printed")
    parser.add_argument("--session-token", default=None, help="the configured key's token")
    parser.add_argument("--role-arn", action="append", default=[], help="a role STS may issue")
    parser.add_argument(
        "--model", action="append", type=_model_pair, default=[],
        help="BEDROCK_ID=MESSAGES_NAME (repeated); default: the shipped catalog's ids",
    )  # fmt: skip
    parser.add_argument("--lifetime", type=int, default=3600, help="seconds issued keys last")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    return parser


async def _serve(server: uvicorn.Server, sock: socket.socket, line: str) -> None:
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if server.started:
        print(line, flush=True)  # the caller reads this one line to learn where it listens
    await task


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    standin = BedrockStandIn(
        upstream=args.upstream,
        region=args.region,
        access_key_id=args.access_key,
        secret_access_key=args.secret_key or secrets.token_urlsafe(30),
        session_token=args.session_token,
        role_arns=tuple(args.role_arn),
        models=dict(args.model) if args.model else catalog_model_map(),
        lifetime=args.lifetime,
    )
    sock = bind(args.host, args.port)
    url = _url(args.host, sock)
    line = json.dumps(
        {"url": url, "sts_url": url, "region": standin.region,
         "access_key_id": standin.access_key_id,
         "secret_access_key": standin.secret_access_key,
         "session_token": standin.session_token, "role_arns": list(standin.role_arns),
         "models": standin.models}
    )  # fmt: skip
    server = uvicorn.Server(uvicorn.Config(standin.app, log_level="warning", lifespan="off"))
    asyncio.run(_serve(server, sock, line))
    return 0
