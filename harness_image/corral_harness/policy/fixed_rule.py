"""The fixed rule: capabilities no allowlist can reach, not even `*`. One place, as data.

Patterns are matched case-insensitively against the tool's bare name (a Menu tool's name
without its `mcp__corral__` prefix) and its full name.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Final

MENU_PREFIX = "mcp__corral__"

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


def forbidden_reason(name: str) -> str | None:
    """Which fixed category hides `name`, or None."""
    candidates = {name.lower(), bare_name(name).lower()}
    for category, patterns in FORBIDDEN.items():
        if any(fnmatchcase(c, p) for c in candidates for p in patterns):
            return f"{category} is out of the agent's reach (fixed rule)"
    return None
