"""The model proxy: the harness's ANTHROPIC_BASE_URL points here, and only here is the key.

Requests are forwarded to the upstream Messages API with the custodian's key in place of
anything the caller sent; streamed answers pass through chunk by chunk as they arrive, and the
usage in them is recorded once the stream ends. Once the budget is spent the proxy answers 429
with the reason and `x-should-retry: false`, so the SDK gives up at once instead of retrying.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from ._usage_store import UsageStore
from .budget import Budget, StreamUsageReader, budget_refusal, usage_of_body

# Never forwarded upstream: the caller's credentials, and hop-by-hop or recomputed headers.
_DROP_REQUEST = {
    "x-api-key", "authorization", "cookie", "host", "content-length", "connection",
    "transfer-encoding", "accept-encoding", "proxy-authorization", "keep-alive",
}  # fmt: skip
_KEEP_RESPONSE = {"content-type", "request-id", "retry-after", "x-should-retry"}


def anthropic_error(status: int, kind: str, message: str, retry: bool = False) -> JSONResponse:
    return JSONResponse(
        {"type": "error", "error": {"type": kind, "message": message}},
        status_code=status,
        headers={"x-should-retry": "true" if retry else "false"},
    )


class ModelProxy:
    def __init__(
        self, upstream_url: str, model_key: str | None, budget: Budget, usage: UsageStore
    ) -> None:
        self._upstream = upstream_url
        self._key = model_key
        self._budget = budget
        self._usage = usage
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def messages(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            return anthropic_error(400, "invalid_request_error", "the body is not JSON")
        if not isinstance(body, dict):
            return anthropic_error(400, "invalid_request_error", "the body must be an object")
        refusal = budget_refusal(self._usage.totals, self._budget)
        if refusal is not None:
            return anthropic_error(429, "budget_exceeded_error", refusal)

        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        # Identity, so the bytes passed through are the bytes the usage reader can parse.
        headers["accept-encoding"] = "identity"
        if self._key:
            headers["x-api-key"] = self._key
        url = self._upstream + request.url.path
        if request.url.query:
            url += "?" + request.url.query
        model = str(body.get("model") or "")
        try:
            upstream = await self._http.send(
                self._http.build_request("POST", url, content=raw, headers=headers), stream=True
            )
        except httpx.HTTPError as e:
            return anthropic_error(
                502, "api_error", f"the model upstream is unreachable: {e}", True
            )

        out_headers = {k: v for k, v in upstream.headers.items() if k.lower() in _KEEP_RESPONSE}
        content_type = upstream.headers.get("content-type", "")
        if content_type.startswith("text/event-stream"):
            return StreamingResponse(
                self._pass_stream(upstream, model),
                status_code=upstream.status_code,
                headers=out_headers,
                media_type="text/event-stream",
            )
        data = await upstream.aread()
        await upstream.aclose()
        if upstream.status_code == 200:
            try:
                call = usage_of_body(model, json.loads(data))
            except ValueError:
                call = None
            if call is not None:
                self._usage.record(call)
        return Response(data, status_code=upstream.status_code, headers=out_headers)

    async def _pass_stream(self, upstream: httpx.Response, model: str) -> AsyncIterator[bytes]:
        reader = StreamUsageReader(model)
        try:
            async for chunk in upstream.aiter_raw():
                reader.feed(chunk)
                yield chunk
        finally:
            await upstream.aclose()
            reader.close()
            # Record even a cut stream: the tokens it reported were spent.
            if reader.saw_usage:
                self._usage.record(reader.usage)
