"""A plan step's machine check, evaluated against the tool results of the step's own run.

What the model writes about its work is never read here: only what its tools returned, and what
an evidence command the runtime ran itself returned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral_api.turnshape import LeafCheck, StepCheck

_EXIT = re.compile(r"\[exit code (\d+)\]\s*$")


@dataclass(frozen=True)
class ToolOutcome:
    name: str
    content: str
    is_error: bool


@dataclass(frozen=True)
class Evidence:
    exit_code: int | None  # None: it did not finish (timeout, could not start)
    output: str


def exit_code_of(outcome: ToolOutcome) -> int | None:
    """A bash result's exit code: 0 when it succeeded, N from its `[exit code N]` line."""
    if outcome.name != "bash":
        return None
    found = _EXIT.search(outcome.content)
    if found:
        return int(found.group(1))
    return None if outcome.is_error else 0


def _json_at(text: str, path: str) -> tuple[bool, Any]:
    try:
        value: Any = json.loads(text)
    except ValueError:
        return False, None
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif (
            isinstance(value, list)
            and part.lstrip("-").isdigit()
            and -len(value) <= int(part) < len(value)
        ):
            value = value[int(part)]
        else:
            return False, None
    return True, value


def _equals(value: Any, want: str) -> bool:
    if isinstance(value, str) and value == want:
        return True
    try:
        return bool(value == json.loads(want))
    except ValueError:
        return False


def leaf_misses(
    check: LeafCheck, results: Sequence[ToolOutcome], evidence: Mapping[str, Evidence]
) -> list[str]:
    """What this check's tests found missing; empty when every test it sets holds."""
    misses: list[str] = []
    texts = [r.content for r in results]
    if check.token is not None and not any(check.token in t.split() for t in texts):
        misses.append(f"no tool result holds the token {check.token!r}")
    if check.contains is not None and not any(check.contains in t for t in texts):
        misses.append(f"no tool result contains {check.contains!r}")
    if check.absent is not None and any(check.absent in t for t in texts):
        misses.append(f"a tool result contains {check.absent!r}")
    if check.exit_code is not None:
        codes = [c for c in (exit_code_of(r) for r in results) if c is not None]
        if not codes:
            misses.append("no command ran in this step")
        elif codes[-1] != check.exit_code:
            misses.append(f"the last command exited {codes[-1]}, not {check.exit_code}")
    if check.json_check is not None:
        want = check.json_check
        found, value = _json_at(texts[-1], want.path) if texts else (False, None)
        if not found:
            misses.append(f"the last tool result has no JSON value at {want.path!r}")
        elif want.equals is not None and not _equals(value, want.equals):
            misses.append(f"{want.path} is {json.dumps(value)[:200]}, not {want.equals!r}")
    if check.evidence is not None:
        ran = evidence.get(check.evidence)
        if ran is None or ran.exit_code != 0:
            code = (
                "did not finish"
                if ran is None or ran.exit_code is None
                else f"exited {ran.exit_code}"
            )
            misses.append(f"evidence `{check.evidence}` {code}")
    return misses


def evidence_commands(check: StepCheck) -> list[str]:
    """The evidence commands a check needs run (the runtime runs them, after the step)."""
    commands = [c.evidence for c in (check, *check.either) if c.evidence is not None]
    return list(dict.fromkeys(commands))


def verdict(
    check: StepCheck, results: Sequence[ToolOutcome], evidence: Mapping[str, Evidence]
) -> tuple[bool, str]:
    """(held, what the check saw)."""
    misses = leaf_misses(check, results, evidence) if check.tests() else []
    if check.either:
        alternatives = [leaf_misses(leaf, results, evidence) for leaf in check.either]
        if all(alternatives):
            misses.append("none of either held: " + "; ".join(a[0] for a in alternatives))
    if misses:
        return False, "; ".join(misses)
    return True, f"held ({', '.join(check.tests() + (['either'] if check.either else []))})"
