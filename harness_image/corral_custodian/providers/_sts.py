"""AWS STS for the Bedrock provider: an hour's keys for the provider's `roleArn`, by
`AssumeRoleWithWebIdentity` (the pod's projected token; the request is not signed) or
`AssumeRole` (role chaining from the Agent's keys; signed with SigV4, service `sts`).

Both are form POSTs to the provider's STS endpoint (API version 2011-06-15) answered in XML.
The minted secret key and session token are registered with the redactor the moment they are
parsed. An STS refusal becomes a `ProviderRefusal` (403 `permission_error`; throttling 429,
retryable); an STS that cannot be reached raises `httpx.HTTPError` for the proxy to answer.

`signed_headers` is also how the Bedrock requests are signed: one place builds the headers
SigV4 covers.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

import httpx

from corral_common import sigv4

from .. import _secrets, settings
from ._base import ProviderRefusal

STS_VERSION = "2011-06-15"
DURATION_SECONDS = 3600
# Minted keys are replaced this long before they expire, so no request is signed with keys
# that lapse while it is on its way.
RENEW_MARGIN_SECONDS = 300
_SESSION_NAME_MAX = 64
_NOT_IN_SESSION_NAME = re.compile(r"[^A-Za-z0-9_+=,.@-]")
_THROTTLED = frozenset({"Throttling", "ThrottlingException", "RequestLimitExceeded"})


@dataclass(frozen=True)
class MintedCredentials:
    credentials: sigv4.Credentials
    expires_at: float  # seconds since the epoch

    def fresh(self, now: float) -> bool:
        return now < self.expires_at - RENEW_MARGIN_SECONDS


def session_name_for(text: str) -> str:
    """A RoleSessionName STS accepts: [\\w+=,.@-], 2 to 64 characters."""
    name = _NOT_IN_SESSION_NAME.sub("-", text)[:_SESSION_NAME_MAX]
    return name if len(name) >= 2 else f"corral-{name}"


def signed_headers(
    method: str,
    url: httpx.URL,
    body: bytes,
    headers: Mapping[str, str],
    *,
    credentials: sigv4.Credentials,
    region: str,
    service: str,
    now: datetime | None = None,
) -> dict[str, str]:
    """`headers` with `host`, `x-amz-date`, the session token (if any) and the
    `authorization` that signs them all and the body."""
    date = sigv4.amz_date(now or datetime.now(UTC))
    out = {"host": url.netloc.decode("ascii"), "x-amz-date": date, **headers}
    if credentials.session_token:
        out["x-amz-security-token"] = credentials.session_token
    # Every service but S3 encodes the already-encoded path once more in the canonical request.
    path = sigv4.uri_encode(url.raw_path.split(b"?")[0].decode("ascii"), keep_slash=True)
    out["authorization"] = sigv4.authorization(
        method, path, [], out, sigv4.sha256_hex(body),
        credentials=credentials, region=region, service=service, amz_date=date,
    )  # fmt: skip
    return out


async def assume_role_with_web_identity(
    http: httpx.AsyncClient, endpoint: str, *, role_arn: str, session_name: str, token: str
) -> MintedCredentials:
    form = _form("AssumeRoleWithWebIdentity", role_arn, session_name)
    form["WebIdentityToken"] = token
    body = urlencode(form).encode()
    response = await http.post(endpoint + "/", content=body, headers=_FORM_HEADERS)
    return _answer(response)


async def assume_role(
    http: httpx.AsyncClient,
    endpoint: str,
    *,
    region: str,
    credentials: sigv4.Credentials,
    role_arn: str,
    session_name: str,
) -> MintedCredentials:
    body = urlencode(_form("AssumeRole", role_arn, session_name)).encode()
    url = httpx.URL(endpoint + "/")
    headers = signed_headers(
        "POST", url, body, _FORM_HEADERS, credentials=credentials, region=region, service="sts"
    )
    response = await http.post(url, content=body, headers=headers)
    return _answer(response)


_FORM_HEADERS = {
    "content-type": "application/x-www-form-urlencoded; charset=utf-8",
    "accept-encoding": "identity",
}


def _form(action: str, role_arn: str, session_name: str) -> dict[str, str]:
    return {
        "Action": action,
        "Version": STS_VERSION,
        "RoleArn": role_arn,
        "RoleSessionName": session_name_for(session_name),
        "DurationSeconds": str(DURATION_SECONDS),
    }


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]  # the element's name without its XML namespace


def _fields(root: ElementTree.Element) -> dict[str, str]:
    """Each leaf element's text by its local name (the answers hold each name once)."""
    return {_local(e.tag): (e.text or "").strip() for e in root.iter() if len(e) == 0}


def _answer(response: httpx.Response) -> MintedCredentials:
    try:
        root: ElementTree.Element | None = ElementTree.fromstring(response.content)
    except ElementTree.ParseError:
        root = None
    if response.status_code != 200:
        raise _refusal(response.status_code, _fields(root) if root is not None else {})
    found = _fields(root) if root is not None else {}
    wanted = ("AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration")
    missing = [name for name in wanted if not found.get(name)]
    if missing:
        raise ProviderRefusal(
            502, "api_error", f"AWS STS answered without {', '.join(missing)}", retry=True
        )
    try:
        # At once: from here on no text the custodian writes can show them.
        settings.register_minted(found["SecretAccessKey"])
        settings.register_minted(found["SessionToken"])
        expires = datetime.fromisoformat(found["Expiration"].replace("Z", "+00:00"))
    except (_secrets.SecretTooShort, ValueError) as e:
        raise ProviderRefusal(502, "api_error", f"AWS STS answered unusable keys: {e}") from None
    if expires.tzinfo is None:
        expires = expires.replace(tzinfo=UTC)
    minted = sigv4.Credentials(
        found["AccessKeyId"], found["SecretAccessKey"], found["SessionToken"]
    )
    return MintedCredentials(minted, expires.timestamp())


def _refusal(status: int, found: Mapping[str, str]) -> ProviderRefusal:
    code = found.get("Code") or f"HTTP {status}"
    message = found.get("Message") or "no message"
    text = f"AWS STS: {code}: {message}"
    if code in _THROTTLED or status == 429:
        return ProviderRefusal(429, "rate_limit_error", text, retry=True)
    if status >= 500:
        return ProviderRefusal(502, "api_error", text, retry=True)
    return ProviderRefusal(403, "permission_error", text)
