"""Google's OAuth 2.0 token endpoint for the Vertex AI provider: the service-account JWT grant
(RFC 7523, as Google documents it for server-to-server applications) and the token it mints.

The key is the Agent's `gcpSecretRef`, a JSON service-account key. The custodian signs a JWT
with it (RS256: RSASSA-PKCS1-v1_5 with SHA-256, by the `cryptography` package) and posts it as
a form to the provider's `tokenUrl`, never to the key's own `token_uri`: the platform, not the
key, says where a credential is sent. The answer is an hour's access token, kept until five
minutes before it expires and registered with the redactor the moment it is read.

Errors: a key that cannot be used is a `KeyProblem` (its text says what is wrong, never the
key's content); a refused grant is a `ProviderRefusal` (401 `authentication_error`; throttled
or failing: 503 `overloaded_error`, retryable); an endpoint that cannot be reached raises
`httpx.HTTPError` for the proxy to answer.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from .. import _secrets, settings
from ._base import ProviderRefusal

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# Google grants at most an hour for a self-signed assertion.
ASSERTION_LIFETIME_SECONDS = 3600
# A token is replaced this long before it expires, so no request carries one that lapses on
# its way (Google's own clients keep a similar margin).
RENEW_MARGIN_SECONDS = 300
_WHERE = "credentials.gcpSecretRef"
_FORM_HEADERS = {
    "content-type": "application/x-www-form-urlencoded",
    "accept-encoding": "identity",
    "accept": "application/json",
}


class KeyProblem(ValueError):
    """The service-account key cannot be used; the text names what is wrong with it."""


@dataclass(frozen=True)
class ServiceAccountKey:
    client_email: str
    private_key_id: str
    private_key: rsa.RSAPrivateKey = field(repr=False)


def parse_key(key_json: str | None) -> ServiceAccountKey:
    """The service-account key in `key_json`, or `KeyProblem`."""
    if key_json is None:
        raise KeyProblem(f"no Google service-account key: the Agent needs {_WHERE}")
    try:
        data = json.loads(key_json)
    except json.JSONDecodeError:
        raise KeyProblem(f"the key in {_WHERE} is not JSON") from None
    if not isinstance(data, dict):
        raise KeyProblem(f"the key in {_WHERE} is not a JSON object")
    kind = data.get("type")
    if kind != "service_account":
        # An `authorized_user` file (a person's gcloud login) is the usual mistake.
        raise KeyProblem(
            f"the key in {_WHERE} is of type {str(kind)[:40]!r}, not a service-account key "
            "(type service_account)"
        )
    missing = [
        name
        for name in ("client_email", "private_key", "private_key_id")
        if not isinstance(data.get(name), str) or not data[name]
    ]
    if missing:
        raise KeyProblem(f"the service-account key in {_WHERE} lacks {', '.join(missing)}")
    try:
        loaded = serialization.load_pem_private_key(data["private_key"].encode(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # The library's reason is not repeated: nothing of the key's text may reach a message.
        raise KeyProblem(
            f"the private_key of the service-account key in {_WHERE} is not a PEM private key"
        ) from None
    if not isinstance(loaded, rsa.RSAPrivateKey):
        raise KeyProblem(f"the private_key of the key in {_WHERE} is not an RSA key")
    return ServiceAccountKey(data["client_email"], data["private_key_id"], loaded)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _segment(value: dict[str, Any]) -> str:
    return _b64url(json.dumps(value, separators=(",", ":")).encode())


def signed_assertion(key: ServiceAccountKey, audience: str, now: float) -> str:
    """The JWT the grant posts: the service account asks `audience` for a cloud-platform
    token, for at most an hour from `now`."""
    issued = int(now)
    header = {"alg": "RS256", "typ": "JWT", "kid": key.private_key_id}
    claims = {
        "iss": key.client_email,
        "scope": SCOPE,
        "aud": audience,
        "iat": issued,
        "exp": issued + ASSERTION_LIFETIME_SECONDS,
    }
    signing_input = f"{_segment(header)}.{_segment(claims)}"
    signature = key.private_key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64url(signature)}"


@dataclass(frozen=True)
class AccessToken:
    value: str = field(repr=False)
    expires_at: float  # seconds since the epoch

    def fresh(self, now: float) -> bool:
        return now < self.expires_at - RENEW_MARGIN_SECONDS


async def exchange(http: httpx.AsyncClient, token_url: str, assertion: str) -> AccessToken:
    """Post the grant to `token_url` and read the token it answers."""
    form = urlencode({"grant_type": GRANT_TYPE, "assertion": assertion}).encode()
    sent_at = time.time()
    response = await http.post(token_url, content=form, headers=_FORM_HEADERS)
    try:
        answer: Any = response.json()
    except ValueError:
        answer = None
    found = answer if isinstance(answer, dict) else {}
    if response.status_code != 200:
        raise _refusal(response.status_code, found)
    value = found.get("access_token")
    if not isinstance(value, str) or not value:
        raise ProviderRefusal(
            502, "api_error", "Google token endpoint: answered without an access_token", True
        )
    try:
        # At once: from here on no text the custodian writes can show it.
        settings.register_minted(value)
    except _secrets.SecretTooShort:
        raise ProviderRefusal(
            502, "api_error", "Google token endpoint: answered an unusable access_token", True
        ) from None
    lifetime = found.get("expires_in")
    if isinstance(lifetime, str) and lifetime.isdigit():
        lifetime = int(lifetime)
    if not isinstance(lifetime, int | float) or isinstance(lifetime, bool) or lifetime <= 0:
        lifetime = ASSERTION_LIFETIME_SECONDS
    return AccessToken(value, sent_at + float(lifetime))


def _refusal(status: int, found: dict[str, Any]) -> ProviderRefusal:
    error = found.get("error")
    code = error if isinstance(error, str) and error else f"HTTP {status}"
    description = found.get("error_description")
    text = f"Google token endpoint: {code}"
    if isinstance(description, str) and description:
        text += f": {description[:500]}"
    if status == 429 or status >= 500:
        return ProviderRefusal(503, "overloaded_error", text, retry=True)
    return ProviderRefusal(401, "authentication_error", text)


class TokenSource:
    """The access token for one key at one token endpoint: minted once, shared by the
    requests in flight, replaced when it is about to expire or was refused."""

    def __init__(self, key: ServiceAccountKey, token_url: str) -> None:
        self._key = key
        self._token_url = token_url
        self._current: AccessToken | None = None
        # Requests that find no fresh token wait for one mint instead of each making one.
        self._lock = asyncio.Lock()

    async def token(self, http: httpx.AsyncClient) -> str:
        current = self._current
        if current is not None and current.fresh(time.time()):
            return current.value
        async with self._lock:
            current = self._current
            if current is not None and current.fresh(time.time()):
                return current.value
            assertion = signed_assertion(self._key, self._token_url, time.time())
            minted = await exchange(http, self._token_url, assertion)
            self._current = minted
            return minted.value

    def drop(self, value: str) -> None:
        """Forget `value` (the provider refused it: revoked, or the account disabled), so the
        next request mints a new one; a token minted since is kept."""
        if self._current is not None and self._current.value == value:
            self._current = None
