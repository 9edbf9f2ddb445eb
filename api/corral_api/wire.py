"""The wire between the operator (or `corral run`) and the harness server. Normative shapes.

Endpoints, relative to `http://<podIP>:8080`:

    POST /agents/{agent}/{conversation}                 AdmitRequest  -> AdmitResponse
    GET  /agents/{agent}/{conversation}/updates?offset=N&wait=S        -> UpdatesResponse
    GET  /agents/{agent}/{conversation}/history                        -> UpdatesResponse
    POST /agents/{agent}/{conversation}/abort           AbortRequest  -> AbortResponse
    GET  /readyz                                                       -> 200 once serving

Errors are 4xx/5xx with an `ErrorBody`.

The custodian's operator port (`http://<podIP>:8082`, opened by the NetworkPolicy to the
operator only, and answering only the wire token) serves the custodian's own record:

    GET  /v1/usage                                                     -> CustodianUsage
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .kinds import AgentSpec, SettlementStatus, ThinkingLevel


class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class AdmitRequest(WireModel):
    message: str = Field(min_length=1)
    model: str | None = None
    thinkingLevel: ThinkingLevel | None = None
    kept: bool = False
    agent: AgentSpec | None = None
    turn: int | None = Field(default=None, ge=0, description="Caller's turn number, for records.")
    idempotencyKey: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9._:-]+$",
        description="Repeating an admission with the same key returns the same submission.",
    )


class AdmitResponse(WireModel):
    streamUrl: str
    offset: int
    submissionId: str


class AbortRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    cause: str | None = None
    submissionId: str | None = None


class AbortResponse(WireModel):
    aborted: bool


class WireUsage(WireModel):
    input: int = 0
    output: int = 0
    cacheRead: int = 0
    cacheWrite: int = 0
    cost: float = 0.0

    def __add__(self, other: WireUsage) -> WireUsage:
        return WireUsage(
            input=self.input + other.input,
            output=self.output + other.output,
            cacheRead=self.cacheRead + other.cacheRead,
            cacheWrite=self.cacheWrite + other.cacheWrite,
            cost=round(self.cost + other.cost, 10),
        )


class WireError(WireModel):
    type: str
    message: str = ""


class Event(BaseModel):
    """One entry of a conversation's stream. `settled` events carry status/error/usage."""

    model_config = ConfigDict(extra="allow")
    offset: int
    type: str
    submissionId: str


class SettledEvent(WireModel):
    offset: int
    type: Literal["settled"] = "settled"
    submissionId: str
    status: SettlementStatus
    error: WireError | None = None
    usage: WireUsage | None = None
    text: str = Field(default="", description="The run's final assistant text.")


class UpdatesResponse(WireModel):
    events: list[dict[str, Any]]
    offset: int


class ErrorBody(WireModel):
    error: str
    reason: str
    kept: bool | None = None


class CustodianBudget(WireModel):
    """The cap the custodian enforces: the lowest of Session, Agent and parent remainder."""

    tokens: int | None = None
    costUSD: float | None = None


class CustodianUsage(WireModel):
    """The custodian's own record of what the session spent; the Session's cost comes from it,
    never from the harness's report."""

    usage: WireUsage
    reserved: WireUsage = Field(
        default_factory=WireUsage, description="Held by requests in flight."
    )
    carved: WireUsage = Field(default_factory=WireUsage, description="Given to children.")
    budget: CustodianBudget = Field(default_factory=CustodianBudget)
    exceeded: bool = False
    reason: str | None = None
