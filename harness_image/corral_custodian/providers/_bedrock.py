"""Amazon Bedrock (`bedrock`): the checked Messages request as Bedrock's `InvokeModel` or
`InvokeModelWithResponseStream`, signed with SigV4, and its answer back in the Messages API's
terms (docs/providers.md).

- The model: the catalog's Bedrock id for the request's model, with the region's cross-region
  inference prefix (`us.`, `eu.`, `apac.`) unless the provider turns it off or the id has one.
- The body: the checked body without `model` and `stream`, with Bedrock's `anthropic_version`
  and the `anthropic-beta` header as the body's `anthropic_beta` list.
- The keys: the Agent's (`awsSecretRef`); with `roleArn`, an hour's keys for that role, from
  the Agent's keys (AssumeRole, role chaining) or the pod's web identity token
  (AssumeRoleWithWebIdentity), minted once for concurrent requests and again 5 minutes before
  they expire (`_sts`).
- A streamed answer: AWS event-stream frames (`_eventstream`), each `chunk` holding one
  Messages event as base64 JSON, relayed as SSE as they arrive; an exception frame becomes an
  `error` event. A refusal: Bedrock's exception type becomes the Anthropic error type the
  engine already handles (the table in docs/providers.md).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from corral_api.providers import BEDROCK_ANTHROPIC_VERSION, ModelProvider
from corral_common import sigv4

from .. import _secrets, settings
from ..model_rules import encode_body
from ..prices import price_for
from . import _sts
from ._base import (
    ModelRequest,
    PassThroughAnswer,
    Provider,
    ProviderRefusal,
    ReadAnswer,
    StreamBroken,
    UpstreamAnswer,
)
from ._eventstream import EventMessage, EventStreamDecoder, EventStreamError

# The geographies of Bedrock's cross-region inference profiles: an id with one keeps it.
GEOGRAPHIES = ("us.", "eu.", "apac.", "global.", "us-gov.", "jp.", "au.")
EVENT_STREAM = "application/vnd.amazon.eventstream"

# Bedrock's exception type -> (status, Anthropic error type, may the SDK retry).
ERRORS: dict[str, tuple[int, str, bool]] = {
    "ThrottlingException": (429, "rate_limit_error", True),
    "ServiceQuotaExceededException": (429, "rate_limit_error", False),
    "AccessDeniedException": (403, "permission_error", False),
    "ResourceNotFoundException": (404, "not_found_error", False),
    "ValidationException": (400, "invalid_request_error", False),
    "UnrecognizedClientException": (401, "authentication_error", False),
    "ExpiredTokenException": (401, "authentication_error", False),
    "InvalidSignatureException": (401, "authentication_error", False),
    "IncompleteSignatureException": (401, "authentication_error", False),
    "MissingAuthenticationTokenException": (401, "authentication_error", False),
    "ServiceUnavailableException": (529, "overloaded_error", True),
    "ModelNotReadyException": (529, "overloaded_error", True),
    "ModelTimeoutException": (504, "api_error", False),
    "InternalServerException": (500, "api_error", True),
}
# The exception frames of a stream (their types are lower camel case) -> Anthropic's type.
STREAM_ERRORS: dict[str, str] = {
    "throttlingexception": "rate_limit_error",
    "servicequotaexceededexception": "rate_limit_error",
    "validationexception": "invalid_request_error",
    "serviceunavailableexception": "overloaded_error",
    "modelnotreadyexception": "overloaded_error",
    "modelstreamerrorexception": "api_error",
    "internalserverexception": "api_error",
    "modeltimeoutexception": "api_error",
}


def bedrock_model_id(model: str, prefix: str) -> str | None:
    """The id Bedrock knows `model` by in a region whose inference profile is `prefix`."""
    # Its own entry (a name or an alias), else that of the longest catalog name it starts
    # with (a newer dated id), as prices are found.
    entry = price_for(model)
    model_id = entry.id_for("bedrock") if entry is not None else None
    if model_id is None:
        return None
    # An ARN (an application inference profile) or an id with a geography is used as is.
    if prefix and not model_id.startswith((*GEOGRAPHIES, "arn:")):
        return f"{prefix}.{model_id}"
    return model_id


def bedrock_body(request: ModelRequest) -> dict[str, Any]:
    body = {k: v for k, v in request.body.items() if k not in ("model", "stream")}
    body["anthropic_version"] = BEDROCK_ANTHROPIC_VERSION
    betas = [b.strip() for b in request.headers.get("anthropic-beta", "").split(",")]
    if any(betas):
        body["anthropic_beta"] = [b for b in betas if b]
    return body


def _error_body(kind: str, message: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def _bedrock_message(data: bytes) -> str:
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for key in ("message", "Message"):
            if isinstance(parsed.get(key), str):
                return str(parsed[key])
    return data.decode("utf-8", "replace")[:500] or "no message"


def translate_error(response: httpx.Response, data: bytes) -> tuple[ReadAnswer, bool]:
    """Bedrock's refusal as the Messages API's, and whether it refused the credentials."""
    error_type = response.headers.get("x-amzn-errortype", "").split(":", 1)[0].strip()
    if not error_type:
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("__type"), str):
            error_type = parsed["__type"].rpartition("#")[2]
    status, kind, retry = ERRORS.get(
        error_type, (response.status_code, "api_error", response.status_code >= 500)
    )
    message = f"Amazon Bedrock: {_bedrock_message(data)}"
    headers = {
        "content-type": "application/json",
        "x-should-retry": "true" if retry else "false",
    }
    for name in ("retry-after", "x-amzn-requestid"):
        if name in response.headers:
            headers["request-id" if name == "x-amzn-requestid" else name] = response.headers[name]
    return ReadAnswer(status, headers, _error_body(kind, message)), status == 401


def _sse(kind: str, data: bytes) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def _error_event(kind: str, message: str) -> bytes:
    return _sse("error", _error_body(kind, f"Amazon Bedrock: {message}"))


def sse_of(message: EventMessage) -> tuple[bytes | None, bool]:
    """One event-stream message as SSE bytes (None: nothing to relay), and whether it ends
    the stream."""
    message_type = message.header(":message-type")
    if message_type == "exception":
        exception = message.header(":exception-type") or "unknown"
        kind = STREAM_ERRORS.get(exception.lower(), "api_error")
        return _error_event(kind, _bedrock_message(message.payload)), True
    if message_type == "error":
        code = message.header(":error-code") or "unknown"
        text = message.header(":error-message") or code
        return _error_event(STREAM_ERRORS.get(code.lower(), "api_error"), text), True
    if message_type != "event" or message.header(":event-type") != "chunk":
        return None, False  # e.g. an initial-response: nothing in the Messages API's terms
    try:
        event = base64.b64decode(json.loads(message.payload)["bytes"], validate=True)
        kind = json.loads(event)["type"]
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise StreamBroken(f"a Bedrock chunk that is not a Messages event: {e!r}") from e
    if not isinstance(kind, str):
        raise StreamBroken("a Bedrock chunk whose event has no type")
    if b"\n" in event or b"\r" in event:
        event = json.dumps(json.loads(event)).encode()  # one SSE data line, whatever came
    return _sse(kind, event), False


class BedrockStreamAnswer(UpstreamAnswer):
    """A 200 event stream, relayed as the Messages API's SSE as its frames arrive."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code = 200
        self.headers = {"content-type": "text/event-stream"}
        if "x-amzn-requestid" in response.headers:
            self.headers["request-id"] = response.headers["x-amzn-requestid"]

    @property
    def is_stream(self) -> bool:
        return True

    async def stream(self) -> AsyncIterator[bytes]:
        decoder = EventStreamDecoder()
        try:
            async for piece in self._response.aiter_bytes():
                for message in decoder.feed(piece):
                    sse, last = sse_of(message)
                    if sse is not None:
                        yield sse
                    if last:
                        return
            decoder.finish()
        except EventStreamError as e:
            raise StreamBroken(f"the Bedrock event stream is broken: {e}") from e

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.stream()])

    async def aclose(self) -> None:
        await self._response.aclose()


class BedrockProvider(Provider):
    def __init__(
        self,
        spec: ModelProvider,
        *,
        credentials: sigv4.Credentials | None,
        web_identity_token_file: Path | None,
        session_name: str,
    ) -> None:
        if spec.region is None:  # the provider entry's validation requires it
            raise ValueError("a bedrock provider needs a region")
        self.name = spec.name
        self.kind = spec.type
        self._spec = spec
        self._region = spec.region
        self._static = credentials
        self._token_file = web_identity_token_file
        self._session_name = _sts.session_name_for(session_name)
        self._minted: _sts.MintedCredentials | None = None
        self._mint_lock = asyncio.Lock()
        # The clock minted keys' expiry is read against (a test moves it on).
        self.clock: Callable[[], float] = time.time

    async def send(self, http: httpx.AsyncClient, request: ModelRequest) -> UpstreamAnswer:
        model_id = bedrock_model_id(request.model, self._spec.inference_prefix())
        if model_id is None:
            raise ProviderRefusal(
                400, "invalid_request_error",
                f"model {request.model} has no Amazon Bedrock id in the model catalog: its "
                "catalog entry needs providers.bedrock (docs/providers.md)",
            )  # fmt: skip
        credentials = await self._credentials(http)
        operation = "invoke-with-response-stream" if request.streamed else "invoke"
        url = httpx.URL(
            f"{self._spec.bedrock_endpoint()}/model/{quote(model_id, safe='')}/{operation}"
        )
        body = encode_body(bedrock_body(request))
        headers = _sts.signed_headers(
            "POST", url, body,
            {
                "content-type": "application/json",
                "accept": EVENT_STREAM if request.streamed else "application/json",
                # Identity: the frames are decoded as they arrive, byte for byte.
                "accept-encoding": "identity",
            },
            credentials=credentials, region=self._region, service="bedrock",
        )  # fmt: skip
        built = http.build_request("POST", url, content=body, headers=headers)
        response = await http.send(built, stream=True)
        if response.status_code == 200:
            if request.streamed:
                return BedrockStreamAnswer(response)
            return PassThroughAnswer(response)
        try:
            data = await response.aread()
        finally:
            await response.aclose()
        answer, credentials_refused = translate_error(response, data)
        minted = self._minted
        if credentials_refused and minted is not None and minted.credentials is credentials:
            self._minted = None  # refused: mint afresh for the next request
        return answer

    # ---------------------------------------------------------------------------- credentials

    async def _credentials(self, http: httpx.AsyncClient) -> sigv4.Credentials:
        if self._spec.role_arn is None:
            if self._static is None:
                raise ProviderRefusal(
                    401, "authentication_error",
                    f"provider {self.name!r} (Amazon Bedrock) has no AWS credentials: set the "
                    "Agent's credentials.awsSecretRef, or the provider's roleArn with "
                    "webIdentity (docs/providers.md)",
                )  # fmt: skip
            return self._static
        minted = self._minted
        if minted is not None and minted.fresh(self.clock()):
            return minted.credentials
        async with self._mint_lock:
            # Another request may have minted while this one waited: then use its keys.
            minted = self._minted
            if minted is None or not minted.fresh(self.clock()):
                minted = await self._mint(http, self._spec.role_arn)
                self._minted = minted
            return minted.credentials

    async def _mint(self, http: httpx.AsyncClient, role_arn: str) -> _sts.MintedCredentials:
        endpoint = self._spec.sts_endpoint()
        if self._static is not None:
            return await _sts.assume_role(
                http, endpoint, region=self._region, credentials=self._static,
                role_arn=role_arn, session_name=self._session_name,
            )  # fmt: skip
        if not self._spec.web_identity:
            raise ProviderRefusal(
                401, "authentication_error",
                f"provider {self.name!r} (Amazon Bedrock) assumes {role_arn} but has nothing to "
                "assume it with: set the Agent's credentials.awsSecretRef, or the provider's "
                "webIdentity (docs/providers.md)",
            )  # fmt: skip
        token = self._web_identity_token()
        return await _sts.assume_role_with_web_identity(
            http, endpoint, role_arn=role_arn, session_name=self._session_name, token=token
        )

    def _web_identity_token(self) -> str:
        """The projected token, read afresh: the kubelet rotates it."""
        if self._token_file is None:
            raise ProviderRefusal(
                401, "authentication_error",
                f"provider {self.name!r} uses the web identity, but the custodian has no "
                "projected token (CORRAL_AWS_WEB_IDENTITY_TOKEN_FILE is not set)",
            )  # fmt: skip
        try:
            token = self._token_file.read_text().strip()
        except OSError as e:
            raise ProviderRefusal(
                401, "authentication_error",
                f"the web identity token {self._token_file} cannot be read: {e.strerror or e}",
            ) from None  # fmt: skip
        if not token:
            raise ProviderRefusal(
                401, "authentication_error", f"the web identity token {self._token_file} is empty"
            )
        try:
            _secrets.register(settings.AWS_WEB_IDENTITY_TOKEN, token)
        except _secrets.SecretTooShort as e:
            raise ProviderRefusal(401, "authentication_error", str(e)) from None
        return token
