"""The wire as a Session's driver sees it: the harness's, with the Agent read afresh."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from corral_api.kinds import AdmissionLedger, AgentSpec
from corral_api.wire import AdmitRequest, AdmitResponse, EndResponse, SettledEvent

from ..driver import CheckResult, EventSink
from ..planning.agent import usable_spec
from ..planning.lineage import with_turn_cap
from ..wireclient import WireClient


class FreshAgentWire:
    """The wire as the driver sees it, with the Agent's spec read afresh at every admission.

    A changed Agent (tools, instructions, model) reaches a running Session on its next
    submission (docs/architecture.md, "A session's life"); a deleted or invalid Agent leaves
    the last valid spec. The turn limit the operator derived from the parent chain stays on it.
    """

    def __init__(
        self,
        inner: WireClient,
        read_agent: Callable[[], Awaitable[dict[str, Any] | None]],
        max_turns: int,
        timed: Callable[[float], None] | None = None,
    ) -> None:
        self._inner = inner
        self._read_agent = read_agent  # the watched Agent, else the API server's
        self._max_turns = max_turns
        self._timed = timed  # told how long each admission call took

    async def admit(self, conversation: str, request: AdmitRequest) -> AdmitResponse:
        fresh = usable_spec(await self._read_agent())
        if fresh is not None:
            request = request.model_copy(update={"agent": with_turn_cap(fresh, self._max_turns)})
        started = time.perf_counter()
        admitted = await self._inner.admit(conversation, request)
        if self._timed is not None:
            self._timed(time.perf_counter() - started)
        return admitted

    async def wait(
        self, conversation: str, ledger: AdmissionLedger, on_event: EventSink | None = None
    ) -> SettledEvent:
        return await self._inner.wait(conversation, ledger, on_event)

    async def abort(
        self, conversation: str, *, cause: str | None = None, submission_id: str | None = None
    ) -> bool:
        return await self._inner.abort(conversation, cause=cause, submission_id=submission_id)

    async def end(
        self, conversation: str, *, agent: AgentSpec | None = None, phase: str | None = None
    ) -> EndResponse:
        # The sessionEnd hooks of the Agent as it is now, like every admission's.
        agent = usable_spec(await self._read_agent()) or agent
        return await self._inner.end(conversation, agent=agent, phase=phase)

    async def checks(self, command: str, timeout_seconds: int | None = None) -> CheckResult:
        return await self._inner.checks(command, timeout_seconds)
