"""Usage accounting and the session budget, as pure values and functions.

The proxy reads usage out of each answer (`message_start` and `message_delta` in a stream, the
`usage` object otherwise); `UsageTotals.add` sums it with its cost; `budget_refusal` says
whether the next model request may go out.
"""

from __future__ import annotations

import json
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
        return self.input + self.output + self.cache_read + self.cache_write

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
        return self.input + self.output + self.cache_read + self.cache_write

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
    tokens: int = 0  # 0: no token budget
    cost: float = 0.0  # 0: no cost budget

    def wire(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "cost": self.cost}


def budget_refusal(totals: UsageTotals, budget: Budget) -> str | None:
    """The reason the next model request may not go out, or None while budget remains."""
    if budget.tokens > 0 and totals.tokens >= budget.tokens:
        return (
            f"the session's token budget is spent: {totals.tokens} of {budget.tokens} tokens used"
        )
    if budget.cost > 0 and totals.cost >= budget.cost:
        return f"the session's cost budget is spent: ${totals.cost:.4f} of ${budget.cost:.4f} used"
    return None


class StreamUsageReader:
    """Follows a Messages SSE stream as it passes through and keeps the answer's usage.

    Fed raw chunks in arrival order; lines may be split across chunks.
    """

    def __init__(self, model: str) -> None:
        self.usage = CallUsage(model=model)
        self.saw_usage = False
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
            self._absorb(message.get("usage"))
        elif event.get("type") == "message_delta":
            self._absorb(event.get("usage"))

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
