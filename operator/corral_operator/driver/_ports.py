"""What the driver needs from the outside: a store for its state and a way to speak the wire."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from corral_api.kinds import AdmissionLedger, AgentSpec
from corral_api.wire import AdmitRequest, AdmitResponse, EndResponse, SettledEvent

from ._state import DriverState

EventSink = Callable[[dict[str, Any]], Awaitable[None] | None]


class TurnStore(Protocol):
    """Where a session's driver state lives: a Session's status, or a local directory."""

    async def load(self) -> DriverState: ...

    async def save(self, state: DriverState) -> None: ...


@dataclass(frozen=True)
class CheckResult:
    exit_code: int
    output: str
    timed_out: bool


class WirePort(Protocol):
    """The harness's wire as the driver uses it (`WireClient` is the one implementation)."""

    async def admit(self, conversation: str, request: AdmitRequest) -> AdmitResponse: ...

    async def wait(
        self,
        conversation: str,
        ledger: AdmissionLedger,
        on_event: EventSink | None = None,
    ) -> SettledEvent:
        """Long-poll until the ledger's submission settles; SettlementFault unless completed."""
        ...

    async def abort(
        self, conversation: str, *, cause: str | None = None, submission_id: str | None = None
    ) -> bool: ...

    async def end(
        self, conversation: str, *, agent: AgentSpec | None = None, phase: str | None = None
    ) -> EndResponse:
        """The session is over: the harness runs the Agent's sessionEnd hooks."""
        ...

    async def checks(self, command: str, timeout_seconds: int | None = None) -> CheckResult: ...
