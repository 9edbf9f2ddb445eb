"""Tool-name matching for the Agent's `tools.allow` / `tools.deny`, and the fixed rule.

One implementation for the harness (what the model is offered and may call) and the custodian
(what a Menu call may do), so the two gates can never disagree on what a pattern means.

Matching: `fnmatch`-style, case-sensitive (`*` and `?` wildcards, `[...]` classes). A name
matches a pattern when either the name itself or its bare form (a Menu tool's name without the
`mcp__corral__` prefix) matches. So for the Menu tool `push`, the model sees
`mcp__corral__push`, and each of `mcp__corral__push`, `mcp__corral__*`, `push`, `*` allows it
(ADR 0005: Menu tools pass the same default-deny allowlist as working tools). Deny wins over
allow, also under `*`. The fixed rule hides its categories whatever the lists say; it matches
case-insensitively, on both forms of the name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Final

MENU_PREFIX: Final = "mcp__corral__"

FORBIDDEN: Final[dict[str, tuple[str, ...]]] = {
    "secrets": ("*secret*", "*credential*", "*api_key*", "*apikey*", "*token_file*", "*password*"),
    "approval gate": ("approve*", "*_approve*", "decide*", "*_decide*", "*decision*"),
    "raw model call": ("*raw_model*", "model_call*", "*messages_create*", "*llm_call*"),
    "kill switch": ("*kill_switch*", "*killswitch*", "*freeze*", "*halt_all*", "*stop_all*"),
    "state rewriting": (
        "*rewrite_state*",
        "*state_rewrite*",
        "*write_state*",
        "*set_state*",
        "*ledger_write*",
        "*rewrite_ledger*",
        "*edit_transcript*",
    ),
}


def bare_name(name: str) -> str:
    return name[len(MENU_PREFIX) :] if name.startswith(MENU_PREFIX) else name


def menu_name(bare: str) -> str:
    """The name the model sees for a Menu tool."""
    return bare if bare.startswith(MENU_PREFIX) else MENU_PREFIX + bare


def forbidden_reason(name: str) -> str | None:
    """Which fixed category hides `name`, or None."""
    candidates = {name.lower(), bare_name(name).lower()}
    for category, patterns in FORBIDDEN.items():
        if any(fnmatchcase(c, p) for c in candidates for p in patterns):
            return f"{category} is out of the agent's reach (fixed rule)"
    return None


def matches(name: str, patterns: Iterable[str]) -> bool:
    names = {name, bare_name(name)}
    return any(fnmatchcase(n, p) for n in names for p in patterns)


def allowed_by_patterns(name: str, allow: Sequence[str], deny: Sequence[str]) -> bool:
    return matches(name, allow) and not matches(name, deny)


def refusal(name: str, allow: Sequence[str], deny: Sequence[str]) -> str | None:
    """Why the Agent's lists (or the fixed rule) refuse `name`, or None when it may run."""
    reason = forbidden_reason(name)
    if reason:
        return reason
    if matches(name, deny):
        return f"{name} is denied by the Agent's tools.deny"
    if not matches(name, allow):
        return f"{name} is not in the Agent's tools.allow"
    return None
