"""The Messages API itself (`anthropic`) and gateways that speak it (`gateway`): the checked
body as the custodian writes it, the key in `x-api-key` or in the gateway's own header."""

from __future__ import annotations

import httpx

from corral_api.providers import ModelProvider

from ..model_rules import encode_body
from ._base import ModelRequest, PassThroughAnswer, Provider, UpstreamAnswer


class MessagesProvider(Provider):
    def __init__(self, spec: ModelProvider, key: str | None) -> None:
        self.name = spec.name
        self.kind = spec.type
        self._url = spec.messages_base() + "/v1/messages"
        self._key = key
        self._header = spec.auth_header if spec.type == "gateway" else "x-api-key"
        self._scheme = spec.auth_scheme if spec.type == "gateway" else None

    async def send(self, http: httpx.AsyncClient, request: ModelRequest) -> UpstreamAnswer:
        headers = dict(request.headers)
        # Identity, so the bytes passed through are the bytes the usage reader can parse.
        headers["accept-encoding"] = "identity"
        headers["content-type"] = "application/json"
        if self._key:
            headers[self._header] = f"{self._scheme} {self._key}" if self._scheme else self._key
        built = http.build_request("POST", self._url, content=encode_body(request.body),
                                   headers=headers)  # fmt: skip
        return PassThroughAnswer(await http.send(built, stream=True))
