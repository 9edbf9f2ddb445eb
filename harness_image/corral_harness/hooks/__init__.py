"""Hooks as a value: phase -> handlers in registration order. No global registry.

`Hooks` is immutable; `with_handler` returns a new value. `run` calls the phase's handlers in
order: a deny halts the chain; added lines accumulate; a system-prompt replacement and a tool
input rewrite pass on to the next handler, which sees the rewritten event.

`hooks_from_spec` turns `Agent.spec.hooks` into handlers over a `HookRunner` (docs/hooks.md).
The runners behind it are `hooks.runners`, imported on their own: they need httpx and a process.
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
from ._spec import (
    PHASE_NAMES,
    SPEC_PHASES,
    BadAnswer,
    HookReply,
    HookRunner,
    event_payload,
    hooks_from_spec,
    read_answer,
    spec_handler,
)

__all__ = [
    "PHASE_NAMES",
    "PRE_PHASES",
    "SPEC_PHASES",
    "BadAnswer",
    "HookEvent",
    "HookHandler",
    "HookOutcome",
    "HookReply",
    "HookResult",
    "HookRunner",
    "Hooks",
    "Phase",
    "add_lines",
    "allow",
    "deny",
    "event_payload",
    "hooks_from_spec",
    "read_answer",
    "replace_system",
    "rewrite_input",
    "spec_handler",
]
