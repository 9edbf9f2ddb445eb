"""`Agent.spec.hooks`: hooks a platform team declares in YAML (docs/hooks.md, ADR 0075).

In the spirit of Claude Code's hooks: per phase a list of hooks, each with an optional
tool-name matcher (beforeTool/afterTool only; `corral_common.toolmatch` patterns) and one
handler, a `command` (the event as JSON on stdin) or an `http` endpoint (POSTed by the
custodian, which adds any credential from `credentials.hookSecretRef`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field
from pydantic.config import JsonDict

from ._base import ApiModel, cel, with_rules

HOOK_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# An RFC 9110 field name.
HEADER_NAME = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"
# Scheme and host fixed up front: the custodian posts to this host and follows no redirect.
HOOK_URL = r"^https?://[^/\s?#@]+(/[^\s]*)?$"
MAX_HOOKS_PER_PHASE = 16
DEFAULT_HOOK_TIMEOUT_SECONDS = 30
MAX_HOOK_TIMEOUT_SECONDS = 600

HookRunIn = Literal["harness", "tools"]
HookOnError = Literal["allow", "deny"]

# The spec's phase names, in the order a turn meets them, and the ones a matcher applies to.
HOOK_PHASES = (
    "sessionStart",
    "beforeTurn",
    "beforeGeneration",
    "afterGeneration",
    "beforeTool",
    "afterTool",
    "afterTurn",
    "sessionEnd",
)
TOOL_PHASES = ("beforeTool", "afterTool")


class HookHeader(ApiModel):
    """One header the custodian adds to an http hook's POST."""

    name: str = Field(min_length=1, max_length=256, pattern=HEADER_NAME, description="Name.")
    value: str | None = Field(
        default=None, max_length=4096, description="A plain value (not a secret)."
    )
    secret_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="Key in the Agent's credentials.hookSecretRef Secret; only the custodian "
        "reads it.",
    )
    prefix: str = Field(
        default="", max_length=64, description="Text before the secret, e.g. 'Bearer '."
    )

    model_config = with_rules(
        cel(
            "has(self.value) != has(self.secretKey)",
            "a header has exactly one of value or secretKey",
        ),
    )


class HttpHook(ApiModel):
    url: str = Field(
        max_length=2048,
        pattern=HOOK_URL,
        description="http(s) URL the custodian POSTs the event to; behind the egress gateway "
        "the operator allows its host to the custodian alone. Redirects are not followed.",
    )
    headers: list[HookHeader] = Field(
        default_factory=list, max_length=16, description="Headers the custodian adds."
    )


class HookSpec(ApiModel):
    """One hook: a matcher (tool phases only) and one handler, command or http."""

    name: str = Field(
        min_length=1, max_length=63, pattern=HOOK_NAME, description="Unique in its phase."
    )
    matcher: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=32,
        description="Tool-name patterns (as in tools.allow); empty matches every tool. "
        "beforeTool and afterTool only.",
    )
    command: str | None = Field(
        default=None,
        min_length=1,
        max_length=65536,
        description="Shell command (/bin/sh -c); the event arrives as JSON on stdin.",
    )
    http: HttpHook | None = Field(default=None, description="An endpoint the custodian POSTs to.")
    run_in: HookRunIn = Field(
        default="harness",
        description="Where a command runs: harness (default; sees the call, not the "
        "workspace) or tools (beside the agent's commands, in the workspace; advisory).",
    )
    timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_HOOK_TIMEOUT_SECONDS,
        description="Seconds before the hook counts as failed; hooks.timeoutSeconds otherwise.",
    )
    on_error: HookOnError = Field(
        default="deny",
        description="What a failure (timeout, crash, bad answer) means: deny (fail closed, "
        "the default) or allow (fail open).",
    )

    model_config = with_rules(
        cel(
            "has(self.command) != has(self.http)",
            "a hook has exactly one handler: command or http",
        ),
        cel(
            "!has(self.http) || !has(self.runIn) || self.runIn == 'harness'",
            "runIn applies to command hooks only: the custodian posts an http hook",
            field_path=".runIn",
        ),
    )


def _phase_list(description: str) -> Any:
    return Field(
        default_factory=list,
        max_length=MAX_HOOKS_PER_PHASE,
        description=description,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )


def _no_matcher(phase: str) -> JsonDict:
    return cel(
        f"!has(self.{phase}) || self.{phase}.all(h, !has(h.matcher) || size(h.matcher) == 0)",
        f"matcher applies to beforeTool and afterTool hooks only, not {phase}",
        field_path=f".{phase}",
    )


class AgentHooks(ApiModel):
    """Hooks per phase, run in the order listed; a deny stops the phase's chain."""

    timeout_seconds: int = Field(
        default=DEFAULT_HOOK_TIMEOUT_SECONDS,
        ge=1,
        le=MAX_HOOK_TIMEOUT_SECONDS,
        description="Default timeout of every hook, in seconds.",
    )
    session_start: list[HookSpec] = _phase_list("Before the first turn of a session.")
    before_turn: list[HookSpec] = _phase_list("Before each turn's first model call.")
    before_generation: list[HookSpec] = _phase_list("Before every model call.")
    after_generation: list[HookSpec] = _phase_list("After every model answer.")
    before_tool: list[HookSpec] = _phase_list("Before a tool call runs.")
    after_tool: list[HookSpec] = _phase_list("After a tool call ran.")
    after_turn: list[HookSpec] = _phase_list("On the turn's final answer.")
    session_end: list[HookSpec] = _phase_list("When the session ends.")

    model_config = with_rules(
        *(_no_matcher(p) for p in HOOK_PHASES if p not in TOOL_PHASES),
    )

    def for_phase(self, phase: str) -> list[HookSpec]:
        """The hooks of a spec phase name (`beforeTool`) or its snake form (`before_tool`)."""
        field = {name: info.alias or name for name, info in type(self).model_fields.items()}
        for attr, alias in field.items():
            if phase in (attr, alias):
                hooks: list[HookSpec] = getattr(self, attr)
                return hooks
        raise KeyError(phase)
