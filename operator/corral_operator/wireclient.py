"""The client side of the wire (`corral_api.wire`): admit, wait, updates, history, abort, checks.

One httpx client for the operator and `corral run`. `wait` long-polls from the admitted offset
and reconnects without end on transport errors and 5xx, with a capped backoff: a harness that is
gone for good shows up as a lost pod elsewhere, or as a 404 here once it is back without the
conversation. It returns on `completed` alone and raises a typed fault otherwise.

Every answer is read as a stream, never whole on trust: a harness may be compromised, and its
history grows with the session. A successful answer larger than `max_answer_bytes` (the
operator's `--max-history-bytes`) stops the read at the cap, closes the connection and raises
`AnswerTooLarge`; a refusal's words are read up to `REFUSAL_READ_BYTES` and clipped. Each call
also has one deadline for the whole answer, so a harness that drips bytes cannot hold it open.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from corral_api.kinds import AdmissionLedger, AgentSpec
from corral_api.wire import (
    BUNDLE_CONTENT_TYPE,
    LOG_CONTENT_TYPE,
    LOG_NEXT_HEADER,
    WIP_BASE_HEADER,
    WIP_REVISION_HEADER,
    WIRE_VERSION_HEADER,
    AbortResponse,
    AdmitRequest,
    AdmitResponse,
    EndRequest,
    EndResponse,
    LogRestored,
    SettledEvent,
    UpdatesResponse,
    wire_version_problem,
)

from .driver._faults import (
    AdmissionRejected,
    AnswerTooLarge,
    ConversationLost,
    SettlementFault,
    WireFault,
    WireRequestFailed,
    WireVersionUnsupported,
)
from .driver._ports import CheckResult, EventSink
from .settings import OperatorSettings

__all__ = [
    "DEFAULT_MAX_ANSWER_BYTES",
    "AdmissionRejected",
    "AnswerTooLarge",
    "CheckResult",
    "ConversationLost",
    "SettlementFault",
    "WireClient",
    "WireFault",
    "WireRequestFailed",
    "WireVersionUnsupported",
    "WorkInProgress",
]


DEFAULT_MAX_ANSWER_BYTES = OperatorSettings().max_history_bytes
# A work-in-progress bundle is made (or applied) by git in the tools container: it may take long.
WIP_TIMEOUT_SECONDS = 300.0


@dataclass(frozen=True)
class WorkInProgress:
    """A workspace's work in progress (`GET .../wip`): the bundle, its commit and its base."""

    bundle: bytes
    revision: str
    base: str | None


# A refusal is shown as at most 500 characters of its reason: no more of it is ever read.
REFUSAL_READ_BYTES = 64 * 1024
_IDENTITY = ("", "identity")


class _Answer:
    """One answer of the harness, read up to a cap: its status and its bytes."""

    def __init__(
        self,
        status_code: int,
        reason_phrase: str,
        content: bytes | bytearray,
        headers: httpx.Headers | None = None,
    ) -> None:
        self.status_code = status_code
        self.reason_phrase = reason_phrase
        self.content = content
        self.headers = headers or httpx.Headers()

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return bytes(self.content).decode("utf-8", errors="replace")


async def read_capped(response: httpx.Response, limit: int, what: str) -> bytearray:
    """The body of a streamed `response`, at most `limit` bytes of it. Past the cap it raises
    `AnswerTooLarge` without reading on (the caller closes the response, and the connection
    with it). Only identity-encoded bodies are read: a compressed one would be inflated in
    memory before it could be counted."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in _IDENTITY:
        raise WireRequestFailed(
            what, response.status_code, f"the answer is encoded ({encoding}); only identity is read"
        )
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise AnswerTooLarge(what, limit)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        if len(body) + len(chunk) > limit:
            raise AnswerTooLarge(what, limit)
        body += chunk
    return body


async def _read_refusal(response: httpx.Response) -> bytearray:
    """The first REFUSAL_READ_BYTES of a refusal's body; the rest is never read."""
    if response.headers.get("content-encoding", "").strip().lower() not in _IDENTITY:
        return bytearray()
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk[: REFUSAL_READ_BYTES - len(body)]
        if len(body) >= REFUSAL_READ_BYTES:
            break
    return body


def _reason(response: _Answer) -> str:
    """The harness's own words for a refusal: ErrorBody.reason, FastAPI's detail, or the text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("reason", "detail", "error", "message"):
            if body.get(key):
                value = body[key]
                return value[:500] if isinstance(value, str) else str(value)[:500]
    return str(body)[:500]


def _body(response: _Answer) -> dict[str, Any]:
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
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        if max_answer_bytes < 1:
            raise ValueError(f"max_answer_bytes must be positive, not {max_answer_bytes}")
        # Identity only: a compressed answer could not be counted before it is inflated.
        headers = {"Accept-Encoding": "identity"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._max_answer_bytes = max_answer_bytes
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

    async def _call(
        self,
        method: str,
        path: str,
        what: str,
        *,
        body: Any = None,
        params: dict[str, str | int | float] | None = None,
        timeout: float = 30.0,
        send: bytes | None = None,
        content_type: str | None = None,
    ) -> _Answer:
        """One request; its answer read up to the cap within `timeout` in all, and closed.
        `send` (with its `content_type`) is sent as it is, instead of `body` as JSON."""
        headers = {"Content-Type": content_type} if content_type else None
        request = self._http.build_request(
            method, path, json=body, params=params, timeout=timeout, content=send,
            headers=headers,
        )  # fmt: skip
        try:
            async with asyncio.timeout(timeout):
                response = await self._http.send(request, stream=True)
                try:
                    problem = wire_version_problem(response.headers.get(WIRE_VERSION_HEADER))
                    if problem is not None:
                        raise WireVersionUnsupported(problem)
                    if response.status_code >= 400:
                        content = await _read_refusal(response)
                    else:
                        content = await read_capped(response, self._max_answer_bytes, what)
                finally:
                    # Unread bytes left: httpx closes the connection rather than reuse it.
                    await response.aclose()
        except TimeoutError:
            raise httpx.ReadTimeout(
                f"the harness's {what} answer took longer than {timeout:g}s", request=request
            ) from None
        return _Answer(response.status_code, response.reason_phrase, content, response.headers)

    # --------------------------------------------------------------------------- verbs

    async def admit(self, conversation: str, request: AdmitRequest) -> AdmitResponse:
        body = request.model_dump(mode="json", exclude_none=True, by_alias=True)
        response = await self._call("POST", self._path(conversation), "admission", body=body)
        if response.status_code == 404:
            raise ConversationLost(conversation, _reason(response))
        if 400 <= response.status_code < 500:
            raise AdmissionRejected(response.status_code, _reason(response), _body(response))
        if response.status_code >= 500:
            raise WireRequestFailed("admission", response.status_code, _reason(response))
        return AdmitResponse.model_validate_json(response.content)

    async def updates(
        self, conversation: str, offset: int = 0, wait: float | None = None
    ) -> UpdatesResponse:
        path = self._path(conversation, "/updates")
        try:
            return await self._updates(path, conversation, offset, wait)
        except _Retry as passing:
            raise WireRequestFailed("updates", passing.status_code, passing.reason) from None

    async def history(self, conversation: str) -> UpdatesResponse:
        response = await self._call("GET", self._path(conversation, "/history"), "history")
        self._raise_for_view(response, conversation, "history")
        return UpdatesResponse.model_validate_json(response.content)

    async def read_log(self, conversation: str, start: int) -> tuple[bytes, int]:
        """The conversation's durable log records from index `start` (ndjson, as the harness
        keeps them), and the index the next read starts from."""
        path = self._path(conversation, "/log")
        response = await self._call("GET", path, "log", params={"from": start}, timeout=120.0)
        self._raise_for_view(response, conversation, "log")
        after = response.headers.get(LOG_NEXT_HEADER, "")
        if not after.isdigit() or int(after) < start:
            raise WireRequestFailed("log", response.status_code, f"{LOG_NEXT_HEADER} {after!r}")
        return bytes(response.content), int(after)

    async def restore_log(self, conversation: str, records: bytes) -> LogRestored | None:
        """Rebuild the conversation in this harness from its archived log records; None when
        the harness holds it already (restored before: the restore is done once)."""
        path = self._path(conversation, "/log")
        response = await self._call(
            "PUT", path, "restore", send=records, content_type=LOG_CONTENT_TYPE, timeout=120.0
        )
        if response.status_code == 409:
            return None
        if response.status_code >= 400:
            raise WireRequestFailed("restore", response.status_code, _reason(response))
        return LogRestored.model_validate_json(response.content)

    async def read_wip(self, conversation: str) -> WorkInProgress | None:
        """The workspace's work in progress; None when it holds nothing beyond the base the
        next pod is checked out at, or the harness keeps none (one from before it: 404)."""
        path = self._path(conversation, "/wip")
        response = await self._call("GET", path, "wip", timeout=WIP_TIMEOUT_SECONDS)
        if response.status_code in (204, 404):
            return None
        if response.status_code >= 400:
            raise WireRequestFailed("wip", response.status_code, _reason(response))
        revision = response.headers.get(WIP_REVISION_HEADER, "")
        if len(revision) != 40:
            raise WireRequestFailed("wip", response.status_code, f"{WIP_REVISION_HEADER} missing")
        base = response.headers.get(WIP_BASE_HEADER) or None
        return WorkInProgress(bytes(response.content), revision, base)

    async def apply_wip(self, conversation: str, wip: WorkInProgress) -> str | None:
        """Apply a work in progress in this harness's workspace; None once applied, else why
        not (a checkout without its base, a harness that keeps none)."""
        path = self._path(conversation, "/wip")
        response = await self._call(
            "PUT", path, "apply wip", send=wip.bundle,
            params={"revision": wip.revision, **({"base": wip.base} if wip.base else {})},
            content_type=BUNDLE_CONTENT_TYPE, timeout=WIP_TIMEOUT_SECONDS,
        )  # fmt: skip
        if response.status_code == 200:
            return None
        return f"{response.status_code}: {_reason(response)}"

    async def abort(
        self, conversation: str, *, cause: str | None = None, submission_id: str | None = None
    ) -> bool:
        body: dict[str, str] = {}
        if cause is not None:
            body["cause"] = cause
        if submission_id is not None:
            body["submissionId"] = submission_id
        response = await self._call("POST", self._path(conversation, "/abort"), "abort", body=body)
        if response.status_code >= 400:
            raise WireRequestFailed("abort", response.status_code, _reason(response))
        return AbortResponse.model_validate_json(response.content).aborted

    async def end(
        self, conversation: str, *, agent: AgentSpec | None = None, phase: str | None = None
    ) -> EndResponse:
        body = EndRequest(agent=agent, phase=phase)
        response = await self._call(
            "POST",
            self._path(conversation, "/end"),
            "end",
            body=body.model_dump(mode="json", exclude_none=True, by_alias=True),
        )
        if response.status_code >= 400:
            raise WireRequestFailed("end", response.status_code, _reason(response))
        return EndResponse.model_validate_json(response.content)

    async def checks(self, command: str, timeout_seconds: int | None = None) -> CheckResult:
        body: dict[str, Any] = {"command": command}
        if timeout_seconds is not None:
            body["timeoutSeconds"] = timeout_seconds
        budget = (timeout_seconds or 300) + 30.0
        response = await self._call("POST", "/checks", "check", body=body, timeout=budget)
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
        `SettlementFault` for failed/ended/aborted, `ConversationLost` on a 404, and
        `AnswerTooLarge` on a page over the cap (not retried: every later page from this
        offset holds at least as much).
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
        response = await self._call("GET", path, "updates", params=params, timeout=timeout)
        if response.status_code >= 500 or response.status_code == 429:
            raise _Retry(response.status_code, _reason(response))
        self._raise_for_view(response, conversation, "updates")
        return UpdatesResponse.model_validate_json(response.content)

    @staticmethod
    def _raise_for_view(response: _Answer, conversation: str, what: str) -> None:
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
