"""Usage accounting and the session budget, as pure values and functions.

The proxy reads usage out of each answer (`message_start` and `message_delta` in a stream, the
`usage` object otherwise); `UsageTotals.add` sums it with its cost. Before a request goes out it
reserves what the request could cost at most (`reservation_for`), and `reservation_refusal`
says whether the budget can cover that on top of what is spent, held by requests in flight and
given to children. `tokens` counts input + output + cache writes; the cost prices every token,
cache reads included.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

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

    Fed raw chunks in arrival order; lines may be split across chunks. It also counts the
    bytes of generated content that passed, so a stream cut before its final usage report
    (an abort, a disconnect, an upstream error) is still charged for what it generated.
    """

    def __init__(self, model: str) -> None:
        self.usage = CallUsage(model=model)
        self.saw_usage = False
        self.saw_start = False
        self.completed = False  # message_stop arrived: the final usage has been reported
        self.content_bytes = 0
        self._buffer = b""

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self._line(line.rstrip(b"\r"))

    def close(self) -> None:
        if self._buffer:
            self._line(self._buffer.rstrip(b"\r"))
            self._buffer = b""

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        try:
            event = json.loads(line[5:].strip())
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if event.get("type") == "message_start":
            message = event.get("message") or {}
            if isinstance(message.get("model"), str) and message["model"]:
                self.usage.model = message["model"]
            self.saw_start = True
            self._absorb(message.get("usage"))
        elif event.get("type") == "message_delta":
            self._absorb(event.get("usage"))
        elif event.get("type") == "message_stop":
            self.completed = True
        elif event.get("type") == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, dict):
                for key in ("text", "partial_json", "thinking"):
                    value = delta.get(key)
                    if isinstance(value, str):
                        self.content_bytes += len(value.encode("utf-8"))

    def settled(self) -> CallUsage | None:
        """The usage to charge once the stream has ended, however it ended; None: nothing."""
        if not self.saw_start and not self.saw_usage:
            return None
        call = CallUsage(**asdict(self.usage))
        if not self.completed:
            # Cut before the final count: charge at least what visibly came through.
            call.output = max(call.output, math.ceil(self.content_bytes / 4))
        return call

    def _absorb(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self.usage.absorb(usage)
            self.saw_usage = True


def usage_of_body(model: str, body: Any) -> CallUsage | None:
    """Usage of a non-streamed answer, or None when it reports none (an error, say)."""
    if not isinstance(body, dict) or not isinstance(body.get("usage"), dict):
        return None
    call = CallUsage(model=str(body.get("model") or model))
    call.absorb(body["usage"])
    return call
