"""Google Vertex AI (`vertex`): Claude by `streamRawPredict` (`rawPredict` unstreamed) in the
provider's project and region, with an access token the service-account key mints
(`_google_token`).

The body is the checked request without `model` (the URL names the model, by the catalog's
Vertex id) and with `anthropic_version: vertex-2023-10-16`; the answer is the Messages API's
own SSE stream, relayed byte for byte. Google's errors (`{"error": {"code", "message",
"status"}}`) become the Anthropic error types the harness knows, with Google's message; an
Anthropic-shaped error (the model's own, which Vertex passes through) stays as it is. A 401
from Vertex drops the cached token, so the next request mints another.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx

from corral_api.providers import VERTEX_ANTHROPIC_VERSION, ModelProvider

from ..model_rules import encode_body
from ..prices import price_for
from ._base import (
    KEEP_RESPONSE,
    ModelRequest,
    PassThroughAnswer,
    Provider,
    ProviderRefusal,
    ReadAnswer,
    UpstreamAnswer,
)
from ._google_token import KeyProblem, TokenSource, parse_key

PROVIDER_NAME = "Google Vertex AI"

# Google's canonical error codes, as the Messages API's error types: (status, type, retry).
GOOGLE_STATUSES: dict[str, tuple[int, str, bool]] = {
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error", True),
    "PERMISSION_DENIED": (403, "permission_error", False),
    "NOT_FOUND": (404, "not_found_error", False),
    "UNAUTHENTICATED": (401, "authentication_error", False),
    "INVALID_ARGUMENT": (400, "invalid_request_error", False),
    "FAILED_PRECONDITION": (400, "invalid_request_error", False),
    "OUT_OF_RANGE": (400, "invalid_request_error", False),
    "UNAVAILABLE": (503, "overloaded_error", True),
    "DEADLINE_EXCEEDED": (504, "api_error", False),
    "INTERNAL": (500, "api_error", True),
}
# A status Google names no code for, by its HTTP status alone.
_BY_HTTP_STATUS: dict[int, tuple[str, bool]] = {
    400: ("invalid_request_error", False),
    401: ("authentication_error", False),
    403: ("permission_error", False),
    404: ("not_found_error", False),
    413: ("request_too_large", False),
    429: ("rate_limit_error", True),
}


def vertex_model_id(model: str) -> str | None:
    """The catalog's Vertex id for `model`: its own entry's (a name or an alias), else that of
    the longest catalog name it starts with (a newer dated id), as prices are found."""
    info = price_for(model)
    return info.id_for("vertex") if info is not None else None


class VertexProvider(Provider):
    def __init__(self, spec: ModelProvider, *, key_json: str | None) -> None:
        self.name = spec.name
        self.kind = "vertex"
        self._models_url = (
            f"{spec.vertex_endpoint()}/v1/projects/{spec.project}/locations/{spec.region}"
            "/publishers/anthropic/models/"
        )
        self._tokens: TokenSource | None = None
        self._key_problem: str | None = None
        try:
            self._tokens = TokenSource(parse_key(key_json), spec.google_token_endpoint())
        except KeyProblem as e:
            # Said at each request, as an answer the harness shows, not as a start failure.
            self._key_problem = str(e)

    async def send(self, http: httpx.AsyncClient, request: ModelRequest) -> UpstreamAnswer:
        tokens = self._tokens
        if tokens is None:
            raise ProviderRefusal(401, "authentication_error", str(self._key_problem))
        model_id = vertex_model_id(request.model)
        if model_id is None:
            raise ProviderRefusal(
                400,
                "invalid_request_error",
                f"model {request.model} has no {PROVIDER_NAME} id in the model catalog: its "
                "entry needs providers.vertex (docs/model-catalog.md)",
            )
        action = "streamRawPredict" if request.streamed else "rawPredict"
        body = {k: v for k, v in request.body.items() if k != "model"}
        body["anthropic_version"] = VERTEX_ANTHROPIC_VERSION
        token = await tokens.token(http)
        headers = {
            "authorization": f"Bearer {token}",
            "content-type": "application/json",
            # Identity, so the bytes passed through are the bytes the usage reader can parse.
            "accept-encoding": "identity",
        }
        beta = request.headers.get("anthropic-beta")
        if beta:
            headers["anthropic-beta"] = beta
        # Quoted: an overlay's id cannot reach another path of the endpoint.
        url = f"{self._models_url}{quote(model_id, safe='@')}:{action}"
        built = http.build_request("POST", url, content=encode_body(body), headers=headers)
        response = await http.send(built, stream=True)
        if response.status_code == 200:
            return PassThroughAnswer(response)
        try:
            data = await response.aread()
        finally:
            await response.aclose()
        if response.status_code == 401:
            tokens.drop(token)  # revoked, or the account disabled: mint anew next time
        return translated_error(response.status_code, response.headers, data)


def _google_error(data: Any) -> dict[str, Any] | None:
    """The `error` object of Google's error shape (sometimes a list of one such answer)."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        error: dict[str, Any] = data["error"]
        if "status" in error or "code" in error or "message" in error:
            return error
    return None


def _anthropic_shaped(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and data.get("type") == "error"
        and isinstance(data.get("error"), dict)
        and isinstance(data["error"].get("type"), str)
    )


def _retryable(status: int) -> bool:
    # The Anthropic SDK's own rule for an answer that does not say.
    return status in (408, 409, 429) or status >= 500


def translated_error(status: int, headers: httpx.Headers, data: bytes) -> UpstreamAnswer:
    """A non-200 answer from Vertex AI as the Messages API would have given it."""
    kept = {k: v for k, v in headers.items() if k.lower() in KEEP_RESPONSE - {"content-type"}}
    kept["content-type"] = "application/json"
    try:
        parsed: Any = json.loads(data)
    except ValueError:
        parsed = None
    if _anthropic_shaped(parsed):
        kept["x-should-retry"] = "true" if _retryable(status) else "false"
        return ReadAnswer(status, kept, data)
    error = _google_error(parsed)
    google_status = error.get("status") if error is not None else None
    if isinstance(google_status, str) and google_status in GOOGLE_STATUSES:
        mapped, kind, retry = GOOGLE_STATUSES[google_status]
    else:
        kind, retry = _BY_HTTP_STATUS.get(status, ("api_error", _retryable(status)))
        mapped = status if status >= 400 else 502
    if error is not None and isinstance(error.get("message"), str) and error["message"]:
        message = str(error["message"])[:2000]
    else:
        text = data.decode("utf-8", "replace").strip()[:300]
        message = f"HTTP {status}" + (f": {text}" if text else "")
    kept["x-should-retry"] = "true" if retry else "false"
    body = {"type": "error", "error": {"type": kind, "message": f"{PROVIDER_NAME}: {message}"}}
    return ReadAnswer(mapped, kept, json.dumps(body).encode())
