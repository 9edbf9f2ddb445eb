"""Usage accounting and the session budget, as pure values and functions.

The proxy reads usage out of each answer (`message_start` and `message_delta` in a stream, the
`usage` object otherwise); `UsageTotals.add` sums it with its cost. Before a request goes out it
reserves what the request could cost at most (`reservation_for`), and `reservation_refusal`
says whether the budget can cover that on top of what is spent, held by requests in flight and
given to children. `tokens` counts input + output + cache writes; the cost prices every token,
cache reads included. When an answer ends, `stream_charge` or `body_charge` says what it is
charged: its reported usage, or, when that cannot be read, the whole reservation (never zero).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from corral_common.sse import EventStreamParser, EventTooLarge

from .prices import call_cost, price_for


@dataclass
class CallUsage:
    """Usage of one model answer."""

    model: str = ""
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    def absorb(self, usage: dict[str, Any]) -> None:
        """Take the counts an answer reports; later reports are cumulative, so they replace."""
        for wire_name, attr in (
            ("input_tokens", "input"),
            ("output_tokens", "output"),
            ("cache_read_input_tokens", "cache_read"),
            ("cache_creation_input_tokens", "cache_write"),
        ):
            value = usage.get(wire_name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                setattr(self, attr, value)

    @property
    def tokens(self) -> int:
        """What a token budget counts: cache reads are cheap and priced, not counted."""
        return self.input + self.output + self.cache_write

    def cost(self) -> float:
        return call_cost(
            self.model,
            input=self.input,
            output=self.output,
            cache_read=self.cache_read,
            cache_write=self.cache_write,
        )


@dataclass
class UsageTotals:
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost: float = 0.0
    requests: int = 0
    unpriced_models: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.input + self.output + self.cache_write

    def add(self, call: CallUsage) -> None:
        self.input += call.input
        self.output += call.output
        self.cache_read += call.cache_read
        self.cache_write += call.cache_write
        self.cost = round(self.cost + call.cost(), 10)
        self.requests += 1
        if call.model and price_for(call.model) is None and call.model not in self.unpriced_models:
            self.unpriced_models.append(call.model)

    def wire(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "output": self.output,
            "cacheRead": self.cache_read,
            "cacheWrite": self.cache_write,
            "cost": self.cost,
            "requests": self.requests,
            "unpricedModels": list(self.unpriced_models),
        }

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> UsageTotals:
        data = json.loads(text)
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Budget:
    tokens: int | None = None  # None: no token cap
    cost: float | None = None  # None: no cost cap

    def wire(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "cost": self.cost}


def lowest(*budgets: Budget) -> Budget:
    """The tightest cap on each axis; an axis none of them caps stays uncapped."""
    tokens = [b.tokens for b in budgets if b.tokens is not None]
    costs = [b.cost for b in budgets if b.cost is not None]
    return Budget(tokens=min(tokens, default=None), cost=min(costs, default=None))


@dataclass(frozen=True)
class Held:
    """Tokens and cost set aside: by requests in flight, or given to children."""

    tokens: int = 0
    cost: float = 0.0

    def __add__(self, other: Held) -> Held:
        return Held(self.tokens + other.tokens, round(self.cost + other.cost, 10))

    def __sub__(self, other: Held) -> Held:
        return Held(self.tokens - other.tokens, round(self.cost - other.cost, 10))


def held_by(call: CallUsage) -> Held:
    return Held(call.tokens, call.cost())


@dataclass(frozen=True)
class Remaining:
    """What is left to spend or give away; None on an axis the budget does not cap."""

    tokens: int | None
    cost: float | None


def remaining(budget: Budget, totals: UsageTotals, reserved: Held, carved: Held) -> Remaining:
    tokens = cost = None
    if budget.tokens is not None:
        tokens = max(0, budget.tokens - totals.tokens - reserved.tokens - carved.tokens)
    if budget.cost is not None:
        cost = max(0.0, round(budget.cost - totals.cost - reserved.cost - carved.cost, 10))
    return Remaining(tokens=tokens, cost=cost)


def budget_refusal(totals: UsageTotals, budget: Budget, carved: Held | None = None) -> str | None:
    """The reason no model request may go out any more, or None while budget remains."""
    given = carved or Held()
    if budget.tokens is not None and totals.tokens + given.tokens >= budget.tokens:
        return (
            f"the session's token budget is spent: {totals.tokens} of {budget.tokens} tokens used"
            + (f", {given.tokens} given to children" if given.tokens else "")
        )
    if budget.cost is not None and totals.cost + given.cost >= budget.cost:
        return (
            f"the session's cost budget is spent: ${totals.cost:.4f} of ${budget.cost:.4f} used"
            + (f", ${given.cost:.4f} given to children" if given.cost else "")
        )
    return None


def reservation_refusal(
    budget: Budget, totals: UsageTotals, reserved: Held, carved: Held, ask: Held
) -> str | None:
    """Why a request that may cost up to `ask` cannot go out now, or None when it fits."""
    spent = budget_refusal(totals, budget, carved)
    if spent is not None:
        return spent
    if budget.tokens is not None and (
        totals.tokens + reserved.tokens + carved.tokens + ask.tokens > budget.tokens
    ):
        return (
            f"the session's token budget cannot cover this request: {totals.tokens} of "
            f"{budget.tokens} tokens used, {reserved.tokens} held by requests in flight, "
            f"{carved.tokens} given to children, and this request may take up to {ask.tokens}"
            " (input estimate plus max_tokens); lower max_tokens or shorten the request"
        )
    if budget.cost is not None and (
        totals.cost + reserved.cost + carved.cost + ask.cost > budget.cost
    ):
        return (
            f"the session's cost budget cannot cover this request: ${totals.cost:.4f} of "
            f"${budget.cost:.4f} used, ${reserved.cost:.4f} held by requests in flight, "
            f"${carved.cost:.4f} given to children, and this request may cost up to "
            f"${ask.cost:.4f}; lower max_tokens or shorten the request"
        )
    return None


def input_estimate(body_bytes: int) -> int:
    """The input tokens a request may bill, before the answer says: ceil(bytes / 4)."""
    return math.ceil(body_bytes / 4)


def reservation_for(model: str, body_bytes: int, max_tokens: int) -> CallUsage:
    """The most a request is expected to cost: its input estimate and all of max_tokens."""
    return CallUsage(model=model, input=input_estimate(body_bytes), output=max_tokens)


class StreamUsageReader:
    """Follows a Messages SSE stream as it passes through and keeps the answer's usage.

    Fed the raw chunks in arrival order, it only observes: the bytes go on to the caller as
    they came. It parses them with the one event-stream parser the harness reads them with
    (`corral_common.sse`: LF, CRLF or lone CR line ends, multi-line data), so what the harness
    is shown is what is counted. It also counts the bytes of generated content that passed, so
    a stream the caller cut before its final usage report is still charged for what it made.
    """

    def __init__(self, model: str) -> None:
        self.usage = CallUsage(model=model)
        self.saw_start = False
        self.final = False  # message_delta reported the cumulative output count
        self.saw_input = False  # an input count was reported (message_start or message_delta)
        self.completed = False  # message_stop arrived
        self.errored = False  # the provider sent an `error` event
        self.unreadable = ""  # why the stream could not be followed, once it could not
        self.cut_inside_event = False  # it ended before an event's blank line
        self.content_bytes = 0
        self._parser = EventStreamParser()

    def feed(self, chunk: bytes) -> None:
        if self.unreadable:
            return
        try:
            events = self._parser.feed(chunk)
        except EventTooLarge as e:
            self.unreadable = str(e)
            return
        for event in events:
            self._event(event.data)

    def close(self) -> None:
        self.cut_inside_event = self._parser.close()

    def _event(self, data: str) -> None:
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            if not isinstance(message, dict):
                return
            if isinstance(message.get("model"), str) and message["model"]:
                self.usage.model = message["model"]
            self.saw_start = True
            usage = message.get("usage")
            if isinstance(usage, dict):
                self.usage.absorb(usage)
                self.saw_input = self.saw_input or _count(usage, "input_tokens")
        elif kind == "message_delta":
            usage = event.get("usage")
            if isinstance(usage, dict):
                self.usage.absorb(usage)
                self.saw_input = self.saw_input or _count(usage, "input_tokens")
                self.final = self.final or _count(usage, "output_tokens")
        elif kind == "message_stop":
            self.completed = True
        elif kind == "error":
            self.errored = True
        elif kind == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, dict):
                for key in ("text", "partial_json", "thinking"):
                    value = delta.get(key)
                    if isinstance(value, str):
                        self.content_bytes += len(value.encode("utf-8"))

    def seen(self) -> CallUsage:
        """What the stream showed: its reported counts, and at least a token for every four
        bytes of content that came through when the final count did not."""
        call = CallUsage(**asdict(self.usage))
        if not self.final:
            call.output = max(call.output, math.ceil(self.content_bytes / 4))
        return call


@dataclass(frozen=True)
class Charge:
    """What one answer is charged, and, when that is not the usage it reported, why."""

    call: CallUsage | None  # None: nothing (the provider refused before generating)
    why: str = ""  # empty when the answer's own usage is charged


def _count(usage: dict[str, Any], name: str) -> bool:
    value = usage.get(name)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _at_least(ask: CallUsage, seen: CallUsage) -> CallUsage:
    """The whole reservation, or more on each count the answer showed more of."""
    return CallUsage(
        model=seen.model or ask.model,
        input=max(ask.input, seen.input),
        output=max(ask.output, seen.output),
        cache_read=seen.cache_read,
        cache_write=seen.cache_write,
    )


def stream_charge(reader: StreamUsageReader, ask: CallUsage, *, upstream_ended: bool) -> Charge:
    """What a 200 stream is charged once it is over, however it ended.

    Its own final usage when it reported one. When the caller went away first (an abort, a
    hang-up), the stream stopped being read: what it showed is charged, and at least the
    input estimate, since the provider had the request. When the provider's stream ended
    with an `error` event, what it showed (nothing when nothing began). Any other stream
    that ended without its final usage (none at all, or no `message_delta` count, or a stream
    the parser could not follow) is charged the whole reservation: an answer whose cost
    cannot be read is never taken as free.
    """
    if reader.final and reader.saw_input and not reader.unreadable:
        return Charge(CallUsage(**asdict(reader.usage)))
    seen = reader.seen()
    if not upstream_ended:
        if not reader.saw_start:
            return Charge(
                CallUsage(model=ask.model, input=ask.input),
                "the caller went away before the answer began: its input estimate is charged",
            )
        return Charge(seen, "the caller went away before the final usage: what came is charged")
    if reader.errored and not reader.unreadable:
        if not reader.saw_start:
            return Charge(None, "the provider answered with an error event")
        return Charge(seen, "the stream ended with an error event: what came is charged")
    if reader.unreadable:
        why = f"the stream could not be read ({reader.unreadable})"
    elif reader.cut_inside_event and not reader.final:
        why = "the stream ended inside an event, before its final usage"
    elif not reader.saw_start and not reader.final:
        why = "the stream reported no usage"
    elif not reader.final:
        why = "the stream ended without its final usage (message_delta)"
    else:
        why = "the stream reported no input count"
    return Charge(_at_least(ask, seen), why + ": the whole reservation is charged")


def body_charge(ask: CallUsage, data: bytes) -> Charge:
    """What a 200 answer that is not a stream is charged: its usage, or, when that cannot be
    read (not JSON, no usage, no input or output count), the whole reservation."""
    try:
        body = json.loads(data)
    except ValueError:
        return Charge(ask, "the answer is not JSON: the whole reservation is charged")
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return Charge(ask, "the answer reported no usage: the whole reservation is charged")
    call = CallUsage(model=str(body.get("model") or ask.model))
    call.absorb(usage)
    if not (_count(usage, "input_tokens") and _count(usage, "output_tokens")):
        return Charge(
            _at_least(ask, call),
            "the answer's usage has no input or output count: the whole reservation is charged",
        )
    return Charge(call)
