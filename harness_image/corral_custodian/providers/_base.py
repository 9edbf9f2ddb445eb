"""What every provider is to the model proxy: it takes the checked request and gives back an
answer in the Messages API's terms (status, the headers the harness may see, and either an SSE
stream of the Messages API's events or a JSON body), whatever its own protocol.

Errors, as this boundary draws them:
- `ProviderRefusal`: decided before anything is sent (no id for the model at this provider, a
  credential that cannot be read or minted); the proxy answers it as an Anthropic-style error.
- `httpx.HTTPError`: the provider (or its token endpoint) cannot be reached; the proxy answers
  502 `api_error`, retryable, and charges nothing.
- `StreamBroken` (or `httpx.HTTPError`) from `UpstreamAnswer.stream()`: the answer broke off;
  the proxy ends the stream with an `api_error` event.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

# Response headers the harness may see, in the Messages API's terms.
KEEP_RESPONSE = frozenset(
    {"content-type", "request-id", "retry-after", "retry-after-ms", "x-should-retry"}
)


@dataclass(frozen=True)
class ModelRequest:
    """A request the custodian has checked: the model as the catalog names it, the body as the
    checks left it (model, max_tokens clamped, `stream` as asked), the `anthropic-*` headers
    allowed through."""

    model: str
    body: dict[str, Any]
    headers: Mapping[str, str]

    @property
    def streamed(self) -> bool:
        return bool(self.body.get("stream"))


class ProviderRefusal(Exception):
    def __init__(self, status: int, kind: str, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.retry = retry


class StreamBroken(Exception):
    """The provider's answer broke off, or could not be read, in the middle."""


class UpstreamAnswer(ABC):
    status_code: int
    headers: dict[str, str]

    @property
    @abstractmethod
    def is_stream(self) -> bool:
        """A 200 whose body is an SSE stream of Messages API events (`stream()` reads it)."""

    @abstractmethod
    def stream(self) -> AsyncIterator[bytes]:
        """The SSE bytes, in pieces as they arrive."""

    @abstractmethod
    async def read(self) -> bytes:
        """The whole body: a Messages API JSON answer or an Anthropic-style error."""

    @abstractmethod
    async def aclose(self) -> None: ...


class Provider(ABC):
    """One way to reach Claude. `name` and `kind` are for logs and metrics."""

    name: str
    kind: str

    @abstractmethod
    async def send(self, http: httpx.AsyncClient, request: ModelRequest) -> UpstreamAnswer: ...

    async def aclose(self) -> None:  # a provider with nothing to close
        return


class PassThroughAnswer(UpstreamAnswer):
    """An httpx response already in the Messages API's terms: relayed byte for byte."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code = response.status_code
        self.headers = {k: v for k, v in response.headers.items() if k.lower() in KEEP_RESPONSE}

    @property
    def is_stream(self) -> bool:
        content_type = self._response.headers.get("content-type", "")
        return self.status_code == 200 and content_type.startswith("text/event-stream")

    async def stream(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.aiter_raw():
            yield chunk

    async def read(self) -> bytes:
        return await self._response.aread()

    async def aclose(self) -> None:
        await self._response.aclose()


class ReadAnswer(UpstreamAnswer):
    """An answer already read and put in the Messages API's terms (a provider's refusal,
    translated)."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status_code = status
        self.headers = headers
        self._body = body

    @property
    def is_stream(self) -> bool:
        return False

    async def stream(self) -> AsyncIterator[bytes]:
        yield self._body

    async def read(self) -> bytes:
        return self._body

    async def aclose(self) -> None:
        return
