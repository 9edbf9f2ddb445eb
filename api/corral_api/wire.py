"""The wire between the operator (or `corral run`) and the harness server. Normative shapes.

Endpoints, relative to `http://<podIP>:8080`:

    POST /agents/{agent}/{conversation}                 AdmitRequest  -> AdmitResponse
    GET  /agents/{agent}/{conversation}/updates?offset=N&wait=S        -> UpdatesResponse
    GET  /agents/{agent}/{conversation}/history                        -> UpdatesResponse
    POST /agents/{agent}/{conversation}/abort           AbortRequest  -> AbortResponse
    POST /agents/{agent}/{conversation}/end             EndRequest    -> EndResponse
    POST /agents/{agent}/{conversation}/steer           SteerRequest  -> SteerResponse
    GET  /agents/{agent}/{conversation}/log?from=N      -> ndjson log records, LOG_NEXT_HEADER
    PUT  /agents/{agent}/{conversation}/log             ndjson log records -> 201 LogRestored
    GET  /agents/{agent}/{conversation}/wip             -> git bundle + WIP headers, or 204
    PUT  /agents/{agent}/{conversation}/wip?revision=R&base=B  git bundle -> WipApplied
    GET  /readyz                                                       -> 200 once serving

Errors are 4xx/5xx with an `ErrorBody`.

The log endpoints carry a conversation across the loss of its pod (issue 27): the operator
reads the durable log from record N as the conversation goes, and restores it, once, into the
new pod's harness (409 `conversation_exists` when that harness holds the conversation already;
400 `bad_request` naming the line of a record that cannot be replayed; 413 `too_large`). What
was in flight settles `failed` with `sandbox_lost`, at the next offset.

The custodian's operator port (`http://<podIP>:8082`, opened by the NetworkPolicy to the
operator only, and answering only the wire token) serves the custodian's own record:

    GET  /v1/usage                                                     -> CustodianUsage
    GET  /v1/delivery                                                  -> CustodianDelivery

The harness asks its custodian (pod-local credential) to deliver the commit it made in the
tools container at the end of a turn (docs/delivery.md):

    POST /agents/{conversation}/deliver  (custodian)    DeliverRequest -> DeliveryRecord

A warm-pool pod (docs/warm-pool.md) answers nothing but `/readyz` and its adopt endpoint until
the operator adopts it, once, with the pod's one-time key as `Authorization: Bearer <key>`:

    POST /v1/adopt  (custodian, operator port)          CustodianAdoptRequest -> AdoptResponse
    POST /adopt     (harness, wire port)                HarnessAdoptRequest   -> AdoptResponse

Refusals: 401 `unauthorized` (no or wrong key), 409 `already_adopted`, 423 `not_adopted` (any
other path before adoption), 400 `bad_request`, 500 `checkout_failed`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .kinds import AgentSpec, SettlementStatus, ThinkingLevel
from .output_schema import schema_problem
from .turnshape import ForcedPlan, PlanStatus


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
    runId: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._:-]+$",
        description="The run id the caller's traces and logs carry (docs/tracing.md); the "
        "harness's spans and its custodian calls carry it too. Default: the submission id.",
    )
    plan: ForcedPlan | None = Field(
        default=None,
        description="A forced plan (the Session's spec.plan): the turn runs the checklist, one "
        "checked step at a time (docs/turns.md).",
    )
    decideThenAct: bool | None = Field(
        default=None,
        description="No reactive fallback: without a working classifier the turn fails "
        "`classifier_unavailable`.",
    )
    replies: list[str] | None = Field(
        default=None,
        max_length=100,
        description="A person's answers to the question the last turn asked (Session "
        "spec.replies not read yet); the turn starts from them.",
    )
    outputSchema: dict[str, Any] | None = Field(
        default=None,
        description="JSON Schema the final answer must satisfy (docs/structured-output.md); an "
        "invalid answer goes back to the model at most twice, then the turn fails "
        "`output_invalid`. The validated answer is the settled event's `output`.",
    )

    @field_validator("outputSchema")
    @classmethod
    def _output_schema_is_a_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        problem = None if value is None else schema_problem(value)
        if problem is not None:
            raise ValueError(f"outputSchema {problem}")
        return value


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


class EndRequest(WireModel):
    """The session is over: the harness runs the Agent's sessionEnd hooks (docs/hooks.md)."""

    agent: AgentSpec | None = Field(
        default=None, description="The Agent spec as re-read now; the last admission's if absent."
    )
    phase: str | None = Field(default=None, max_length=64, description="The Session's phase.")


class EndResponse(WireModel):
    ended: bool = Field(description="False for an unknown or already ended conversation.")
    denied: bool = Field(default=False, description="A sessionEnd hook denied (reported only).")
    reason: str | None = None


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


TurnOutcome = Literal["success", "partial", "abstain", "handed_to_human"]


class TokensByLayer(WireModel):
    """Tokens (input + output + cache writes) each layer of the turn spent."""

    classifier: int = Field(default=0, ge=0)
    planner: int = Field(default=0, ge=0)
    reactive: int = Field(default=0, ge=0)
    executor: int = Field(default=0, ge=0)


class TurnReceipt(WireModel):
    """The turn's ledger as the `settled` event's `receipt` (and the per-turn record on the
    state volume, the last 20 kept). docs/ledger.md."""

    requestedLoop: str = Field(description="The loop the Agent (or caller) asked for.")
    handler: str = Field(description="The handler that actually ran the turn.")
    route: str = Field(description="The route chosen (reactive, direct, oneTool, ...).")
    toolsRun: list[str] = Field(description="Tool calls that ran, in order, by name.")
    toolsBlocked: list[str] = Field(description="Tool calls that were blocked, by name.")
    tokensByLayer: TokensByLayer
    outcome: TurnOutcome
    phasePath: list[str] = Field(description="The phases the turn passed, in order.")
    model: str
    thinkingLevel: ThinkingLevel = Field(description="The level at the end (a steer may move it).")
    steps: int = Field(ge=0, description="Tool calls started (what the runaway watch counts).")
    contextTokens: dict[str, int] = Field(
        default_factory=dict, description="The last context assembly's tokens per layer."
    )
    usage: WireUsage | None = Field(
        default=None,
        description="The settlement's usage (input, output, cache-read and cache-write tokens, "
        "cost); absent when the model never answered.",
    )


TURN_RECEIPT_KEYS = frozenset(TurnReceipt.model_fields)


class SteerRequest(WireModel):
    """`POST /agents/{agent}/{conversation}/steer`: a later message in the turn in flight,
    given to the model before its next request; `thinkingLevel` changes the level from that
    request on (and for later turns of the conversation that name none). 409 `no_turn` when
    nothing runs (or `submissionId` names another submission)."""

    message: str | None = Field(default=None, min_length=1, max_length=262144)
    thinkingLevel: ThinkingLevel | None = None
    submissionId: str | None = Field(default=None, min_length=1, max_length=200)

    @model_validator(mode="after")
    def _says_something(self) -> SteerRequest:
        if self.message is None and self.thinkingLevel is None:
            raise ValueError("a steer carries a message, a thinkingLevel, or both")
        return self


class SteerResponse(WireModel):
    steered: bool
    submissionId: str


class SettledEvent(WireModel):
    offset: int
    type: Literal["settled"] = "settled"
    submissionId: str
    status: SettlementStatus
    error: WireError | None = None
    usage: WireUsage | None = None
    text: str = Field(default="", description="The run's final assistant text.")
    receipt: TurnReceipt | None = Field(
        default=None, description="The turn's ledger; absent when the turn never started."
    )
    question: str | None = Field(
        default=None,
        description="The turn asked a person this and stopped; the next turn starts from the "
        "reply (docs/turns.md).",
    )
    plan: PlanStatus | None = Field(
        default=None, description="The plan and each step's verdict, when the turn had one."
    )
    output: Any = Field(
        default=None,
        description="The final answer parsed and validated against the admission's outputSchema; "
        "absent without one.",
    )


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


# ------------------------------------------------------------------------------ delivery

FULL_SHA = r"^[0-9a-f]{40}$"
DeliveryState = Literal["Delivered", "NothingToDeliver", "Failed"]


# A person's bearer token for the operator's archive reader (docs/history.md), beside or instead
# of `Authorization`: the API server's service proxy authenticates the caller and drops their
# `Authorization` before it forwards, so `corral logs` through the proxy carries the token here;
# the reader reviews it exactly as it reviews a direct call's.
READER_AUTHORIZATION_HEADER = "X-Corral-Authorization"


# The agent's commits reach the custodian as data: the harness has the tools side write a git
# bundle of the commits since `BundleBase.base` and sends its bytes (content type
# BUNDLE_CONTENT_TYPE) to `POST /agents/{conversation}/bundle?revision=<tip>`; the custodian
# checks it, fetches it into its own mirror and answers `BundleAccepted`. Delivery, `push` and
# `land` then act only on revisions the mirror holds.
BUNDLE_CONTENT_TYPE = "application/x-git-bundle"


class BundleBase(WireModel):
    """`GET /agents/{conversation}/bundle-base`: the revision the custodian's mirror already
    holds for this session (its last push, else the Session's ref as the remote has it); the
    harness's bundle needs only the commits after it. None: nothing is known (no remote), a
    bundle must then be complete."""

    base: str | None = Field(default=None, pattern=FULL_SHA)
    branch: str = ""


class BundleAccepted(WireModel):
    """The custodian fetched the bundle into its mirror; `revision` is the tip it took (the one
    the harness named, never the bundle's ref names)."""

    revision: str = Field(pattern=FULL_SHA)
    bytes: int = Field(ge=0)


class DeliverRequest(WireModel):
    """The harness: the commit it left for this turn (None: it made none, deliver HEAD as it
    stands), and the submission it belongs to."""

    revision: str | None = Field(default=None, pattern=FULL_SHA)
    submissionId: str = Field(default="", max_length=200)


class DeliveryRecord(WireModel):
    """The custodian's record of its last delivery. `revision` and `pushedAt` name the last
    revision actually pushed to `branch` (kept across a later NothingToDeliver or Failed);
    `attempted` the revision the last delivery tried."""

    state: DeliveryState
    branch: str
    revision: str | None = Field(default=None, pattern=FULL_SHA)
    pushedAt: str | None = None
    attempted: str | None = Field(default=None, pattern=FULL_SHA)
    message: str = ""
    submissionId: str = ""
    deliveries: int = Field(default=0, ge=0, description="Deliveries attempted so far.")
    noRemote: bool = Field(
        default=False,
        description="The Session's repo is not a remote the custodian pushes to (a local path, "
        "file://): nothing can be delivered, by design, and the session's outcome stands.",
    )


class CustodianDelivery(WireModel):
    """`GET :8082/v1/delivery`: the last delivery, or None before the first one."""

    delivery: DeliveryRecord | None = None


# ------------------------------------------------------------------------------ warm pool

ADOPT_SECRET_MIN_CHARS = 32


class AdoptedSession(WireModel):
    """The Session a pooled pod now serves."""

    name: str = Field(min_length=1, max_length=253)
    namespace: str = Field(min_length=1, max_length=63)
    uid: str = Field(min_length=1, max_length=128)


class CheckoutRequest(WireModel):
    """What to clone into the workspace, as the checkout init container of a cold pod would."""

    repo: str = Field(min_length=1, max_length=4096)
    ref: str = Field(min_length=1, max_length=255)
    branch: str = Field(min_length=1, max_length=255, description="The branch it is made on.")


class HarnessAdoptRequest(WireModel):
    """Binds a pooled harness to its Session: the wire token it answers from now on, the
    credential it presents to the custodian, and the workspace it checks out."""

    wireToken: str = Field(min_length=ADOPT_SECRET_MIN_CHARS, max_length=512)
    custodianCredential: str = Field(min_length=ADOPT_SECRET_MIN_CHARS, max_length=512)
    grantedRoot: str = Field(default="/workspace", min_length=1, max_length=4096)
    readOnly: bool = False
    checkout: CheckoutRequest


class CustodianAdoptRequest(WireModel):
    """Binds a pooled custodian to its Session: who it serves, what it enforces."""

    wireToken: str = Field(min_length=ADOPT_SECRET_MIN_CHARS, max_length=512)
    custodianCredential: str = Field(min_length=ADOPT_SECRET_MIN_CHARS, max_length=512)
    session: AdoptedSession
    agentName: str = Field(min_length=1, max_length=63)
    agent: AgentSpec
    budget: CustodianBudget = Field(default_factory=CustodianBudget)
    branch: str = Field(min_length=1, max_length=255, description="The only branch push targets.")
    gitRemoteUrl: str = Field(min_length=1, max_length=4096)
    readOnly: bool = False
    egressCredential: str | None = Field(
        default=None,
        min_length=ADOPT_SECRET_MIN_CHARS,
        max_length=512,
        description="The Session's proxy credential for the egress gateway (docs/egress.md); "
        "absent where sandboxes leave without a gateway.",
    )
    memoryDsn: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="The memory database's DSN (docs/memory.md); absent without one.",
    )


class AdoptResponse(WireModel):
    adopted: bool
    seconds: float = Field(ge=0, description="Time the adoption took inside the pod.")


# ------------------------------------------------------------------------------ log and restore

# `GET .../log?from=N` answers records N.. of the conversation's durable log as ndjson (one
# JSON record a line: `sub`, `ev`, `tx`; only records known on disk) with this header naming the
# index the next read starts from. `PUT .../log` takes the records of such reads, concatenated.
LOG_NEXT_HEADER = "Corral-Log-Next"
LOG_CONTENT_TYPE = "application/x-ndjson"


class LogRestored(WireModel):
    """`PUT .../log` (201): the conversation was rebuilt from the records sent."""

    restored: bool
    records: int = Field(ge=0, description="Log records written and replayed.")
    events: int = Field(ge=0, description="Events replayed (offsets as they were).")
    interrupted: list[str] = Field(
        description="Submissions that were in flight, settled `failed` with `sandbox_lost`."
    )


# ------------------------------------------------------------------------------ work in progress

# `GET .../wip`: the workspace as it stands mid-turn, as a git bundle (BUNDLE_CONTENT_TYPE) of a
# commit of the working tree on top of HEAD (WIP_REVISION_HEADER) and the commits since the base
# the Session's next pod is checked out at (WIP_BASE_HEADER: the custodian's bundle base, the
# delivered revision or the starting ref's commit; empty: the bundle holds the whole history);
# 204 when the workspace holds nothing beyond that base. `PUT .../wip?revision=R&base=B` applies
# such a bundle in a new pod checked out at B: R's tree over the worktree, HEAD left at B, the
# changes uncommitted (422 `wip_not_applied` when HEAD is not B, or the checkout lacks the
# bundle's base). A harness without these endpoints answers 404: it keeps no work in progress.
WIP_REVISION_HEADER = "Corral-Wip-Revision"
WIP_BASE_HEADER = "Corral-Wip-Base"


class WipApplied(WireModel):
    """`PUT .../wip` (200): the work in progress is back in the worktree."""

    applied: bool
    revision: str = Field(description="The work-in-progress commit whose tree was checked out.")


# ------------------------------------------------------------------------------ the wire's version

# Every answer of the harness names the wire's version (`MAJOR.MINOR`). A minor version only adds
# (fields, endpoints) and keeps every shape before it; a major one may change them. The operator
# drives a harness of its own major version whose minor is at most one behind its own (or ahead:
# the additions are not read); it refuses to read any other, and says why, rather than misread
# it. An answer without the header is a harness from before it: version 1.0.
#   1.0  the wire before it stated its version (no header).
#   1.1  the version header on every answer; `GET`/`PUT .../wip` (a 1.0 harness answers them
#        404, which the operator reads as "no work in progress": nothing is kept or restored).
# Nothing of 1.1 has been released yet, so it may still grow; once released, any addition is 1.2.
WIRE_VERSION = "1.1"
WIRE_VERSION_HEADER = "Corral-Wire-Version"
WIRE_VERSION_BEFORE_HEADER = "1.0"


def _version(text: str) -> tuple[int, int] | None:
    major, dot, minor = text.strip().partition(".")
    if not dot or not major.isdigit() or not minor.isdigit():
        return None
    return int(major), int(minor)


def wire_version_problem(given: str | None, ours: str = WIRE_VERSION) -> str | None:
    """Why an operator of wire version `ours` cannot drive a harness that answers `given` (the
    header's value, None when absent); None when it can."""
    theirs = _version(given if given is not None else WIRE_VERSION_BEFORE_HEADER)
    mine = _version(ours)
    assert mine is not None, ours
    if theirs is None:
        return f"the harness names wire version {given!r}, which is not MAJOR.MINOR"
    if theirs[0] != mine[0]:
        return (
            f"the harness speaks wire version {theirs[0]}.{theirs[1]} and this operator "
            f"{ours}: another major version is never read"
        )
    if theirs[1] < mine[1] - 1:
        return (
            f"the harness speaks wire version {theirs[0]}.{theirs[1]}, more than one minor "
            f"version behind this operator's {ours}"
        )
    return None
