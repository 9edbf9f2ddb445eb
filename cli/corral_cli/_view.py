"""What `corral run` shows: a live rich view on a terminal, plain lines otherwise, or JSON.

All three take the same stream: wire events (message, tool_start, tool_end, ...) and the
driver's own events (`source: "driver"`: admitted, settled, finished), and keep a running
total of usage and cost. A child session's events (docs/children.md) carry `session` (its
name): their lines are prefixed with it, and the status panel lists each child's phase.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from ._errors import no_color

_ARGS_CHARS = 160
_RESULT_CHARS = 240


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _args(value: Any) -> str:
    if isinstance(value, dict) and set(value) == {"command"}:
        return str(value["command"])
    return json.dumps(value, ensure_ascii=False)


def message_text(event: dict[str, Any]) -> str:
    blocks = event.get("content") or []
    if isinstance(blocks, str):
        return blocks
    return "\n".join(
        str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text"
    ).strip()


@dataclass
class Tally:
    """Usage so far: settled turns in full, plus the model answers of the turn in flight."""

    settled: dict[str, float] = field(default_factory=dict)
    in_flight: dict[str, float] = field(default_factory=dict)
    phase: str = "Pending"
    turn: int = 0
    tools_run: int = 0
    tools_blocked: int = 0
    # Child sessions by name: their phase and turn, from their own driver's events.
    children: dict[str, str] = field(default_factory=dict)

    def add_message(self, usage: dict[str, Any] | None) -> None:
        for key, value in (usage or {}).items():
            if isinstance(value, int | float):
                self.in_flight[key] = self.in_flight.get(key, 0) + value

    def settle(self, usage: dict[str, Any] | None) -> None:
        source = usage if usage else self.in_flight
        for key, value in source.items():
            if isinstance(value, int | float):
                self.settled[key] = self.settled.get(key, 0) + value
        self.in_flight = {}

    def total(self, key: str) -> float:
        return self.settled.get(key, 0) + self.in_flight.get(key, 0)

    def line(self) -> str:
        return (
            f"tokens in {int(self.total('input'))} out {int(self.total('output'))} "
            f"cache r/w {int(self.total('cacheRead'))}/{int(self.total('cacheWrite'))}  "
            f"cost ${self.total('cost'):.4f}"
        )


class View(Protocol):
    def __enter__(self) -> View: ...
    def __exit__(self, *exc: object) -> None: ...
    def event(self, event: dict[str, Any]) -> None: ...
    def note(self, text: str) -> None: ...
    def outcome(self, record: dict[str, Any]) -> None: ...
    def prompt(self, question: str) -> str: ...


def _track_child(tally: Tally, event: dict[str, Any]) -> None:
    name = str(event["session"])
    kind = event.get("type")
    if event.get("source") != "driver":
        return
    if kind == "admitted":
        tally.children[name] = f"Running, turn {event.get('turn')}"
    elif kind == "settled":
        tally.children[name] = str((event.get("decision") or {}).get("phase", "Running"))
    elif kind in ("finished", "created"):
        tally.children[name] = str(event.get("phase", "Pending"))


def _track(tally: Tally, event: dict[str, Any]) -> None:
    kind = event.get("type")
    if event.get("session"):  # a child session's: its own phase, not this session's
        _track_child(tally, event)
        return
    if event.get("source") == "driver":
        if kind == "admitted":
            tally.turn = int(event.get("turn", tally.turn))
            tally.phase = "Running"
        elif kind == "settled":
            tally.settle(event.get("usage"))
            tally.phase = str((event.get("decision") or {}).get("phase", tally.phase))
        elif kind == "finished":
            tally.phase = str(event.get("phase", tally.phase))
        return
    if kind == "message":
        tally.add_message(event.get("usage"))
    elif kind == "tool_end":
        tally.tools_run += 1
    elif kind == "tool_blocked":
        tally.tools_blocked += 1
    elif kind == "approval_requested":
        tally.phase = "WaitingForHuman"
    if kind in ("tool_start", "tool_end") and tally.phase == "WaitingForHuman":
        tally.phase = "Running"


def describe(event: dict[str, Any]) -> tuple[str, str] | None:
    """(style, line) for an event worth a line, or None."""
    child = event.get("session")
    if child:
        if event.get("source") == "driver" and event.get("type") == "created":
            return "magenta", f"[{child}] child session started: {event.get('message', '')}"
        line = _describe(event)
        return None if line is None else (line[0], f"[{child}] {line[1]}")
    return _describe(event)


def _describe(event: dict[str, Any]) -> tuple[str, str] | None:
    kind = event.get("type")
    if event.get("source") == "driver":
        if kind == "admitted":
            first = _one_line(str(event.get("message", "")), _RESULT_CHARS)
            return "bold cyan", f"turn {event.get('turn')} admitted: {first}"
        if kind == "settled":
            line = f"turn {event.get('turn')} settled {event.get('status')}"
            if event.get("error"):
                line += f" ({event['error']})"
            evaluation = event.get("evaluation")
            if evaluation:
                mark = "PASS" if evaluation.get("passed") else "FAIL"
                line += f"\nevaluation {mark}: {evaluation.get('summary')}"
            decision = event.get("decision") or {}
            if decision.get("action") == "continue":
                line += "\nanother turn: the evaluation guard's budget is not spent"
            return "bold cyan", line
        return None
    if kind == "message":
        text = message_text(event)
        return ("white", f"assistant: {text}") if text else None
    if kind == "tool_start":
        args = _one_line(_args(event.get("input")), _ARGS_CHARS)
        return "yellow", f"▶ {event.get('name')} {args}"
    if kind == "tool_end":
        status = "error" if event.get("isError") else "ok"
        result = _one_line(str(event.get("result", "")), _RESULT_CHARS)
        return ("red" if event.get("isError") else "green"), f"  ◀ {status}: {result}"
    if kind == "tool_blocked":
        return "red", f"✖ {event.get('name')} {event.get('outcome')}: {event.get('reason', '')}"
    if kind == "approval_requested":
        return (
            "magenta",
            f"? approval requested for {event.get('name')} ({event.get('approvalId')})",
        )
    if kind == "settled" and isinstance(event.get("receipt"), dict):
        return ledger_line(event["receipt"], event.get("error"))
    if kind == "steered":
        said = f": {_one_line(str(event['message']), _RESULT_CHARS)}" if "message" in event else ""
        return "magenta", f"↪ steered (thinking {event.get('thinkingLevel')}){said}"
    return describe_shape(event)


def ledger_line(receipt: dict[str, Any], error: Any = None) -> tuple[str, str]:
    """The turn's ledger in two lines (docs/ledger.md): route, outcome, tools, tokens, phases."""
    tokens = receipt.get("tokensByLayer") or {}
    spent = ", ".join(f"{layer} {n}" for layer, n in tokens.items() if n)
    line = (
        f"ledger: {receipt.get('outcome')} via {receipt.get('route')}"
        f" (asked {receipt.get('requestedLoop')}, ran {receipt.get('handler')});"
        f" {len(receipt.get('toolsRun') or [])} tools run,"
        f" {len(receipt.get('toolsBlocked') or [])} blocked; tokens {spent or 0}"
        f"\n  phases: {' → '.join(receipt.get('phasePath') or [])}"
    )
    if isinstance(error, dict) and error.get("type") == "runaway":
        line += f"\n  runaway: {error.get('message')}"
    style = "cyan" if receipt.get("outcome") == "success" else "yellow"
    return style, line


_VERDICT_MARKS = {"Held": "✔", "Missed": "↻", "Struck": "✖", "Pending": "·"}


def plan_lines(plan: dict[str, Any]) -> str:
    """A plan and each step's verdict, one line a step (docs/turns.md)."""
    lines = [f"plan ({plan.get('state')}):"]
    for number, step in enumerate(plan.get("steps") or [], 1):
        mark = _VERDICT_MARKS.get(str(step.get("verdict")), "?")
        line = f"  {mark} {number}. {step.get('action')} [{step.get('verdict')}]"
        if step.get("detail"):
            line += f": {_one_line(str(step['detail']), _RESULT_CHARS)}"
        lines.append(line)
    return "\n".join(lines)


def describe_shape(event: dict[str, Any]) -> tuple[str, str] | None:
    """The turn's shape: its route, a question for a person, an off-path step, the plan."""
    kind = event.get("type")
    if kind == "route":
        why = f" ({event['reason']})" if event.get("reason") else ""
        return "cyan", f"route: {event.get('route')} via {event.get('handler')}{why}"
    if kind == "question":
        return "bold magenta", f"? the turn asks: {event.get('question')}"
    if kind == "step_rejected":
        return "red", f"✖ off the path: {event.get('reason')}"
    if kind == "step_verdict":
        mark = "held" if event.get("held") else "missed"
        return ("green" if event.get("held") else "red"), (
            f"check of step {event.get('step')}: {mark}: {event.get('detail')}"
        )
    if kind == "plan":
        return "cyan", plan_lines(event.get("plan") or {})
    return None


def outcome_word(record: dict[str, Any]) -> str:
    """The outcome line's first word: the session's phase, or Interrupted / Error."""
    return str(record.get("outcome") or record.get("phase"))


class PlainView:
    """Plain lines for logs and pipes: no colour, no live widgets."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.tally = Tally()

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.out.flush()

    def event(self, event: dict[str, Any]) -> None:
        _track(self.tally, event)
        line = describe(event)
        if line is not None:
            print(line[1], file=self.out, flush=True)
        settled = event.get("source") == "driver" and event.get("type") == "settled"
        if settled and not event.get("session"):
            print(f"usage: {self.tally.line()}", file=self.out, flush=True)

    def note(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def outcome(self, record: dict[str, Any]) -> None:
        print(f"{outcome_word(record)}: {record['message']}", file=self.out, flush=True)

    def prompt(self, question: str) -> str:
        return input(question)


class JsonView:
    """One JSON object per line: every event, then the outcome."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout

    def __enter__(self) -> JsonView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.out.flush()

    def event(self, event: dict[str, Any]) -> None:
        print(json.dumps(event, ensure_ascii=False), file=self.out, flush=True)

    def note(self, text: str) -> None:
        print(json.dumps({"type": "note", "text": text}), file=self.out, flush=True)

    def outcome(self, record: dict[str, Any]) -> None:
        print(json.dumps({"type": "outcome", **record}), file=self.out, flush=True)

    def prompt(self, question: str) -> str:
        raise EOFError("JSON output is not interactive")


class LiveView:
    """The terminal view: events scroll above a status panel that stays at the bottom."""

    def __init__(self, title: str, console: Console | None = None) -> None:
        # $NO_COLOR (or --no-color): no escape sequence for style at all, not only no colour
        # (rich's own no_color keeps bold and dim); the status panel still redraws in place.
        self.console = console or Console(color_system=None if no_color() else "auto")
        self.title = title
        self.tally = Tally()
        self._live = Live(self._panel(), console=self.console, refresh_per_second=8)

    def _panel(self) -> Panel:
        t = self.tally
        body = Text.assemble(
            ("phase ", "dim"),
            (t.phase, "bold"),
            ("   turn ", "dim"),
            (str(t.turn), "bold"),
            ("   tools ", "dim"),
            (f"{t.tools_run} run, {t.tools_blocked} blocked", ""),
            "\n",
            (t.line(), "dim"),
            *[("\n" + f"child {name}: {phase}", "magenta") for name, phase in t.children.items()],
        )
        return Panel(Group(body), title=escape(self.title), expand=False)

    def __enter__(self) -> LiveView:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.update(self._panel())
        self._live.__exit__(None, None, None)

    def event(self, event: dict[str, Any]) -> None:
        _track(self.tally, event)
        line = describe(event)
        if line is not None:
            style, text = line
            self.console.print(Text(text, style=style))
        self._live.update(self._panel())

    def note(self, text: str) -> None:
        self.console.print(Text(text, style="dim"))

    def prompt(self, question: str) -> str:
        # The status panel would redraw over the question; it pauses while a person answers.
        self._live.stop()
        try:
            return self.console.input(question)
        finally:
            self._live.start()

    def outcome(self, record: dict[str, Any]) -> None:
        word = outcome_word(record)
        style = "bold green" if word == "Succeeded" else "bold red"
        self.console.print(Text(f"{word}: {record['message']}", style=style))


def choose_view(title: str, *, json_lines: bool, out: TextIO | None = None) -> View:
    stream = out or sys.stdout
    if json_lines:
        return JsonView(stream)
    if stream.isatty():
        return LiveView(title)
    return PlainView(stream)
