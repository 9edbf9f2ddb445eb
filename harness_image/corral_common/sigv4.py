"""AWS Signature Version 4: the few lines of it a client of an AWS-style API needs (the
operator's S3 archive now; Bedrock requests from the custodian may sign with it too).

A request is signed in its `Authorization` header (never in the query string): the canonical
request is hashed, the string to sign names the date, the region and the service, and the key
is derived from the secret by four HMACs. The unit tests hold it to AWS's published examples.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:  # a log line or a traceback never shows the secret
        return f"Credentials(access_key_id={self.access_key_id!r}, secret_access_key=***)"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def uri_encode(text: str, *, keep_slash: bool) -> str:
    """RFC 3986 encoding as SigV4 wants it: everything but A-Z a-z 0-9 - _ . ~ (and `/` in a
    path) as %XX of its UTF-8 bytes, upper-case hex."""
    return quote(text, safe="-_.~/" if keep_slash else "-_.~")


def canonical_query(params: Sequence[tuple[str, str]]) -> str:
    encoded = sorted((uri_encode(k, keep_slash=False), uri_encode(v, keep_slash=False))
                     for k, v in params)  # fmt: skip
    return "&".join(f"{k}={v}" for k, v in encoded)


def _canonical_value(value: str) -> str:
    return " ".join(value.strip().split())


def canonical_request(
    method: str,
    path: str,
    params: Sequence[tuple[str, str]],
    headers: Mapping[str, str],
    payload_sha256: str,
) -> tuple[str, str]:
    """The canonical request and the signed headers' list. `path` is already encoded (S3
    encodes each key segment once; other services encode the encoded path again)."""
    lowered = sorted((k.lower().strip(), _canonical_value(v)) for k, v in headers.items())
    signed = ";".join(k for k, _ in lowered)
    text = "\n".join(
        [
            method.upper(),
            path or "/",
            canonical_query(params),
            "".join(f"{k}:{v}\n" for k, v in lowered),
            signed,
            payload_sha256,
        ]
    )
    return text, signed


def signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    key = _hmac(f"AWS4{secret}".encode(), day)
    key = _hmac(key, region)
    key = _hmac(key, service)
    return _hmac(key, "aws4_request")


def authorization(
    method: str,
    path: str,
    params: Sequence[tuple[str, str]],
    headers: Mapping[str, str],
    payload_sha256: str,
    *,
    credentials: Credentials,
    region: str,
    service: str,
    amz_date: str,
) -> str:
    """The `Authorization` header for a request whose headers (with `host` and `x-amz-date`
    among them) are all signed."""
    day = amz_date[:8]
    scope = f"{day}/{region}/{service}/aws4_request"
    request, signed = canonical_request(method, path, params, headers, payload_sha256)
    to_sign = "\n".join([ALGORITHM, amz_date, scope, sha256_hex(request.encode("utf-8"))])
    key = signing_key(credentials.secret_access_key, day, region, service)
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    return (
        f"{ALGORITHM} Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )


def amz_date(now: datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ")
