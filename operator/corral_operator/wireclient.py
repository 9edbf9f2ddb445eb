"""The client side of the wire (DESIGN §4): admit, wait, updates, history, abort, checks.

One httpx client for the operator and `corral run`. `wait` long-polls from the admitted offset
and reconnects without end on transport errors and 5xx, with a capped backoff: a harness that is
gone for good shows up as a lost pod elsewhere, or as a 404 here once it is back without the
conversation. It returns on `completed` alone and raises a typed fault otherwise.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from corral_api.kinds import AdmissionLedger, AgentSpec
from corral_api.wire import (
    AbortResponse,
    AdmitRequest,
    AdmitResponse,
    EndRequest,
    EndResponse,
    SettledEvent,
    UpdatesResponse,
)

from .driver._faults import (
    AdmissionRejected,
    ConversationLost,
    SettlementFault,
    WireFault,
    WireRequestFailed,
)
from .driver._ports import CheckResult, EventSink

__all__ = [
    "AdmissionRejected",
    "CheckResult",
    "ConversationLost",
    "SettlementFault",
    "WireClient",
    "WireFault",
    "WireRequestFailed",
]


def _reason(response: httpx.Response) -> str:
    """The harness's own words for a refusal: ErrorBody.reason, FastAPI's detail, or the text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("reason", "detail", "error", "message"):
            if body.get(key):
                value = body[key]
                return value if isinstance(value, str) else str(value)
    return str(body)[:500]


def _body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


class WireClient:
    """Speaks the wire to one harness at `base_url` for one agent name."""

    def __init__(
        self,
        base_url: str,
        agent: str,
        *,
        token: str | None = None,
        poll_wait: float = 20.0,
        backoff_initial: float = 0.05,
        backoff_cap: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(30.0),
            transport=transport,
        )
        self._agent = agent
        self._poll_wait = poll_wait
        self._backoff_initial = backoff_initial
        self._backoff_cap = backoff_cap

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> WireClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _path(self, conversation: str, suffix: str = "") -> str:
        agent = quote(self._agent, safe="")
        conv = quote(conversation, safe="")
        return f"/agents/{agent}/{conv}{suffix}"

    # --------------------------------------------------------------------------- verbs

    async def admit(self, conversation: str, request: AdmitRequest) -> AdmitResponse:
        body = request.model_dump(mode="json", exclude_none=True, by_alias=True)
        response = await self._http.post(self._path(conversation), json=body)
        if response.status_code == 404:
            raise ConversationLost(conversation, _reason(response))
        if 400 <= response.status_code < 500:
            raise AdmissionRejected(response.status_code, _reason(response), _body(response))
        if response.status_code >= 500:
            raise WireRequestFailed("admission", response.status_code, _reason(response))
        return AdmitResponse.model_validate(response.json())

    async def updates(
        self, conversation: str, offset: int = 0, wait: float | None = None
    ) -> UpdatesResponse:
        path = self._path(conversation, "/updates")
        try:
            return await self._updates(path, conversation, offset, wait)
        except _Retry as passing:
            raise WireRequestFailed("updates", passing.status_code, passing.reason) from None

    async def history(self, conversation: str) -> UpdatesResponse:
        response = await self._http.get(self._path(conversation, "/history"))
        self._raise_for_view(response, conversation, "history")
        return UpdatesResponse.model_validate(response.json())

    async def abort(
        self, conversation: str, *, cause: str | None = None, submission_id: str | None = None
    ) -> bool:
        body: dict[str, str] = {}
        if cause is not None:
            body["cause"] = cause
        if submission_id is not None:
            body["submissionId"] = submission_id
        response = await self._http.post(self._path(conversation, "/abort"), json=body)
        if response.status_code >= 400:
            raise WireRequestFailed("abort", response.status_code, _reason(response))
        return AbortResponse.model_validate(response.json()).aborted

    async def end(
        self, conversation: str, *, agent: AgentSpec | None = None, phase: str | None = None
    ) -> EndResponse:
        body = EndRequest(agent=agent, phase=phase)
        response = await self._http.post(
            self._path(conversation, "/end"),
            json=body.model_dump(mode="json", exclude_none=True, by_alias=True),
        )
        if response.status_code >= 400:
            raise WireRequestFailed("end", response.status_code, _reason(response))
        return EndResponse.model_validate(response.json())

    async def checks(self, command: str, timeout_seconds: int | None = None) -> CheckResult:
        body: dict[str, Any] = {"command": command}
        if timeout_seconds is not None:
            body["timeoutSeconds"] = timeout_seconds
        budget = (timeout_seconds or 300) + 30.0
        response = await self._http.post("/checks", json=body, timeout=budget)
        if response.status_code >= 400:
            raise WireRequestFailed("check", response.status_code, _reason(response))
        data = response.json()
        return CheckResult(
            exit_code=int(data["exitCode"]),
            output=str(data.get("output", "")),
            timed_out=bool(data.get("timedOut", False)),
        )

    async def wait(
        self,
        conversation: str,
        ledger: AdmissionLedger,
        on_event: EventSink | None = None,
    ) -> SettledEvent:
        """Long-poll from the ledger's offset until its submission settles.

        Every event received is handed to `on_event` in order (events of other submissions
        too: the caller keeps the transcript). Returns the settlement when `completed`; raises
        `SettlementFault` for failed/ended/aborted and `ConversationLost` on a 404.
        """
        path = self._stream_path(conversation, ledger.stream_url)
        offset = ledger.offset
        backoff = self._backoff_initial
        while True:
            try:
                page = await self._updates(path, conversation, offset, self._poll_wait)
            except (httpx.TransportError, _Retry):
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._backoff_cap)
                continue
            backoff = self._backoff_initial
            if not page.events:
                # Nothing within the long-poll: ask again, but let other tasks run first, and
                # do not spin on a harness that answers at once.
                await asyncio.sleep(self._backoff_initial)
            for event in page.events:
                if on_event is not None:
                    result = on_event(event)
                    if inspect.isawaitable(result):
                        await result
                if event.get("type") == "settled" and event.get("submissionId") == (
                    ledger.submission_id
                ):
                    settled = SettledEvent.model_validate(
                        {k: v for k, v in event.items() if k in SettledEvent.model_fields}
                    )
                    if settled.status == "completed":
                        return settled
                    raise SettlementFault(settled)
            offset = max(offset, page.offset)

    # ------------------------------------------------------------------------- helpers

    def _stream_path(self, conversation: str, stream_url: str) -> str:
        # Only the path is kept: a re-attaching operator reaches the pod at its current address.
        path = urlsplit(stream_url).path if stream_url else ""
        return path or self._path(conversation, "/updates")

    async def _updates(
        self, path: str, conversation: str, offset: int, wait: float | None
    ) -> UpdatesResponse:
        params: dict[str, str | int | float] = {"offset": offset}
        timeout = 30.0
        if wait is not None:
            params["wait"] = wait
            timeout = wait + 15.0
        response = await self._http.get(path, params=params, timeout=timeout)
        if response.status_code >= 500 or response.status_code == 429:
            raise _Retry(response.status_code, _reason(response))
        self._raise_for_view(response, conversation, "updates")
        return UpdatesResponse.model_validate(response.json())

    @staticmethod
    def _raise_for_view(response: httpx.Response, conversation: str, what: str) -> None:
        if response.status_code == 404:
            raise ConversationLost(conversation, _reason(response))
        if response.status_code >= 400:
            raise WireRequestFailed(what, response.status_code, _reason(response))


class _Retry(Exception):
    """A passing refusal (5xx, 429) that the long-poll loop waits out."""

    def __init__(self, status_code: int, reason: str) -> None:
        self.status_code = status_code
        self.reason = reason
        super().__init__(f"{status_code}: {reason}")
