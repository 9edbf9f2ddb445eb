"""Children that report back (pure; docs/children.md).

A parent whose turn ends while children it started still run waits (`WaitingForChildren`)
instead of finishing. It resumes by its wait mode: `all` (default: every child waited for has
finished), `first` (a child finished that has not reported yet), `quorum` (n of the group
succeeded, or n can no longer be reached), `supervise` (each child's end wakes it). Each
finished child sews one line into the parent's next turn: name, outcome, the summary of its
final answer, and the branch and revision it pushed; a child reports once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from corral_api.kinds import FINAL_PHASES, WaitingFor

from ._state import DriverState

SUMMARY_LIMIT = 300


@dataclass(frozen=True)
class ChildrenReport:
    """The message that resumes a parent, and the children it reports on."""

    message: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class _Child:
    name: str
    phase: str
    status: dict[str, Any]


def _children(children: list[dict[str, Any]], waiting: WaitingFor | None) -> list[_Child]:
    rows = [
        _Child(
            str((c.get("metadata") or {}).get("name", "")),
            str((c.get("status") or {}).get("phase") or "Pending"),
            dict(c.get("status") or {}),
        )
        for c in children
    ]
    if waiting is not None and waiting.children:
        named = set(waiting.children)
        rows = [r for r in rows if r.name in named]
    return sorted(rows, key=lambda r: r.name)


def waiting_for_of(tool_input: dict[str, Any]) -> WaitingFor:
    """The wait a `wait_children` call asked for; what does not parse waits for all (the
    custodian already refused a bad input, so this is only a safety net)."""
    try:
        return WaitingFor.model_validate(
            {k: tool_input[k] for k in ("mode", "quorum", "children") if k in tool_input}
        )
    except ValidationError:
        return WaitingFor()


def running_children(children: list[dict[str, Any]]) -> int:
    return sum(1 for c in _children(children, None) if c.phase not in FINAL_PHASES)


def wait_satisfied(
    waiting: WaitingFor | None, children: list[dict[str, Any]], reported: list[str]
) -> bool:
    """Whether a parent waiting by `waiting` (None: all) may resume now."""
    rows = _children(children, waiting)
    finished = [r for r in rows if r.phase in FINAL_PHASES]
    if len(finished) == len(rows):
        return True  # nothing left to wait for
    mode = waiting.mode if waiting is not None else "all"
    fresh = [r for r in finished if r.name not in reported]
    if mode in ("first", "supervise"):
        return bool(fresh)
    if mode == "quorum":
        assert waiting is not None
        need = min(waiting.quorum or len(rows) // 2 + 1, len(rows))
        succeeded = sum(r.phase == "Succeeded" for r in rows)
        failed = sum(r.phase in ("Failed", "Stopped") for r in rows)
        return succeeded >= need or len(rows) - failed < need
    return False


def _summary(text: str | None) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= SUMMARY_LIMIT else line[: SUMMARY_LIMIT - 3] + "..."


def child_line(name: str, phase: str, status: dict[str, Any]) -> str:
    """One finished child, in one line."""
    answer = _summary(status.get("answer"))
    if phase != "Succeeded" and status.get("message"):
        answer = _summary(f"{status['message']}. {answer}" if answer else status["message"])
    delivery = status.get("delivery") or {}
    if delivery.get("revision"):
        where = f"pushed {delivery.get('branch')} at {delivery['revision']}"
    else:
        where = "pushed nothing"
    return f"- child {name}: {phase}: {answer or '(no answer)'} ({where})"


def hold_for_children(state: DriverState, children: list[dict[str, Any]]) -> None:
    """A session about to succeed while children it started still run waits for them instead,
    by the wait it last asked for, else all of them: `state` is changed in place."""
    if state.phase != "Succeeded":
        return
    running = running_children(children)
    if not running:
        return
    state.waiting_for = state.waiting_for or WaitingFor()
    state.phase = "WaitingForChildren"
    state.finished_at = None
    state.message = (
        f"{state.message}; waiting for {running} child session(s) still running "
        f"(wait mode {state.waiting_for.mode})"
    )


def children_report(
    waiting: WaitingFor | None, children: list[dict[str, Any]], reported: list[str]
) -> ChildrenReport:
    """The message that resumes the parent: a line per finished child not reported yet."""
    rows = _children(children, None)
    fresh = [r for r in rows if r.phase in FINAL_PHASES and r.name not in reported]
    still = [r.name for r in rows if r.phase not in FINAL_PHASES]
    mode = waiting.mode if waiting is not None else "all"
    lines = [f"Your child sessions report back (wait mode: {mode}):"]
    lines += [child_line(r.name, r.phase, r.status) for r in fresh] or ["- no child has finished"]
    if still:
        lines.append(f"Still running: {', '.join(still)}.")
    lines.append("Continue with your task.")
    return ChildrenReport("\n".join(lines), tuple(r.name for r in fresh))
