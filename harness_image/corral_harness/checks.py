"""`POST /checks`: run an evaluation command in the granted root (the evaluation guard's probe)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .paths import GrantedRoot
from .tools import run_command

CHECK_OUTPUT_CHARS = 4000


class CheckRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str = Field(min_length=1, max_length=65536)
    timeoutSeconds: int = Field(default=300, ge=1, le=3600)


class CheckResult(BaseModel):
    exitCode: int
    output: str
    timedOut: bool


async def run_check(root: GrantedRoot, request: CheckRequest) -> CheckResult:
    outcome = await run_command(
        ["/bin/sh", "-c", request.command], str(root.root), float(request.timeoutSeconds)
    )
    return CheckResult(
        exitCode=outcome.exit_code,
        output=outcome.output[-CHECK_OUTPUT_CHARS:],
        timedOut=outcome.timed_out,
    )
