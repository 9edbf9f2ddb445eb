"""Hooks as a value: phase -> handlers in registration order. No global registry.

`Hooks` is immutable; `with_handler` returns a new value. `run` calls the phase's handlers in
order: a deny halts the chain; added lines accumulate; a system-prompt replacement and a tool
input rewrite pass on to the next handler, which sees the rewritten event.
"""

from ._hooks import (
    PRE_PHASES,
    HookEvent,
    HookHandler,
    HookOutcome,
    HookResult,
    Hooks,
    Phase,
    add_lines,
    allow,
    deny,
    replace_system,
    rewrite_input,
)

__all__ = [
    "PRE_PHASES",
    "HookEvent",
    "HookHandler",
    "HookOutcome",
    "HookResult",
    "Hooks",
    "Phase",
    "add_lines",
    "allow",
    "deny",
    "replace_system",
    "rewrite_input",
]
