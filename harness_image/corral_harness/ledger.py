"""The turn's ledger: an append-only record of what one turn did, and the receipt made from it.

Two writers keep it, each with its own entry kinds, and neither writes the other's:

- the loop (the turn's decision layer and the reactive loop): the requested loop, the route
  chosen, the handler that ran, the phases passed, tokens per layer and the outcome;
- the tool runner: each tool that ran and each that was blocked, with the reason.

Entries are only ever appended; the receipt (`to_receipt`, the wire's `receipt` keys in
`corral_api.wire.TURN_RECEIPT_KEYS`) is derived from them, so a late writer can never rewrite
what an earlier one put down. docs/ledger.md describes the keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, get_args

Layer = Literal["classifier", "planner", "reactive", "executor"]
LAYERS: Final[tuple[Layer, ...]] = get_args(Layer)

Outcome = Literal["success", "partial", "abstain", "handed_to_human"]
OUTCOMES: Final[tuple[Outcome, ...]] = get_args(Outcome)

# Who may append which entry kinds (the two writers never share a kind).
LOOP_KINDS: Final = frozenset({"requested_loop", "route", "handler", "phase", "tokens", "outcome"})
TOOL_KINDS: Final = frozenset({"tool_run", "tool_blocked"})

# The route and handler a turn has when nothing chose otherwise: today's reactive tool loop.
REACTIVE: Final = "reactive"


class _Tokens(Protocol):
    @property
    def tokens(self) -> int: ...  # input + output + cache writes (engine.seam.Usage)


@dataclass(frozen=True)
class LedgerEntry:
    writer: Literal["loop", "tools"]
    kind: str
    value: Any
    detail: str = ""


class LedgerError(ValueError):
    """A writer tried to append an entry kind that is not its own, or a value out of range."""


@dataclass
class TurnLedger:
    """One turn's append-only ledger. The loop and the tool runner each get their own writer
    methods; `to_receipt` folds the entries into the receipt the wire carries."""

    entries: list[LedgerEntry] = field(default_factory=list)

    # ---------------------------------------------------------------- the loop's entries

    def set_requested_loop(self, loop: str) -> None:
        self._loop("requested_loop", loop)

    def set_route(self, route: str) -> None:
        self._loop("route", route)

    def set_handler(self, name: str) -> None:
        self._loop("handler", name)

    def phase(self, name: str) -> None:
        """The turn entered phase `name` (a phase once entered stays in the path)."""
        self._loop("phase", name)

    def add_tokens(self, layer: Layer, usage: _Tokens | int) -> None:
        """Tokens spent by one model call of `layer` (input + output + cache writes, as the
        budget counts them; an int is taken as is)."""
        if layer not in LAYERS:
            raise LedgerError(f"unknown token layer {layer!r}; one of {', '.join(LAYERS)}")
        spent = usage if isinstance(usage, int) else usage.tokens
        self._loop("tokens", spent, layer)

    def set_outcome(self, outcome: Outcome) -> None:
        if outcome not in OUTCOMES:
            raise LedgerError(f"unknown outcome {outcome!r}; one of {', '.join(OUTCOMES)}")
        self._loop("outcome", outcome)

    # ---------------------------------------------------------------- the tool runner's entries

    def tool_run(self, name: str) -> None:
        self._tools("tool_run", name)

    def tool_blocked(self, name: str, reason: str = "") -> None:
        self._tools("tool_blocked", name, reason)

    # ---------------------------------------------------------------- reading

    def latest(self, kind: str, default: Any = None) -> Any:
        for entry in reversed(self.entries):
            if entry.kind == kind:
                return entry.value
        return default

    def tokens_by_layer(self) -> dict[str, int]:
        totals: dict[str, int] = dict.fromkeys(LAYERS, 0)
        for entry in self.entries:
            if entry.kind == "tokens":
                totals[entry.detail] += entry.value
        return totals

    def total_tokens(self) -> int:
        return sum(e.value for e in self.entries if e.kind == "tokens")

    def to_receipt(self) -> dict[str, Any]:
        """The ledger's part of the turn receipt (docs/ledger.md)."""
        route = self.latest("route", REACTIVE)
        return {
            "requestedLoop": self.latest("requested_loop", route),
            "handler": self.latest("handler", route),
            "route": route,
            "toolsRun": [e.value for e in self.entries if e.kind == "tool_run"],
            "toolsBlocked": [e.value for e in self.entries if e.kind == "tool_blocked"],
            "tokensByLayer": self.tokens_by_layer(),
            "outcome": self.latest("outcome", "success"),
            "phasePath": [e.value for e in self.entries if e.kind == "phase"],
        }

    # ---------------------------------------------------------------- appending

    def _loop(self, kind: str, value: Any, detail: str = "") -> None:
        self._append(LedgerEntry("loop", kind, value, detail))

    def _tools(self, kind: str, value: Any, detail: str = "") -> None:
        self._append(LedgerEntry("tools", kind, value, detail))

    def _append(self, entry: LedgerEntry) -> None:
        own = LOOP_KINDS if entry.writer == "loop" else TOOL_KINDS
        if entry.kind not in own:
            raise LedgerError(f"the {entry.writer} writer may not append {entry.kind!r} entries")
        self.entries.append(entry)
