"""`POST /checks`: run an evaluation command in the granted root (the evaluation guard's probe).

It runs where the working tools run: in-process, or in the tools container through the exec
service.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .ports import Workspace, WorkspaceError

CHECK_OUTPUT_CHARS = 4000
KEEP_BYTES = 1_000_000


class CheckRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str = Field(min_length=1, max_length=65536)
    timeoutSeconds: int = Field(default=300, ge=1, le=3600)


class CheckResult(BaseModel):
    exitCode: int
    output: str
    timedOut: bool


async def run_check(workspace: Workspace, request: CheckRequest) -> CheckResult:
    try:
        outcome = await workspace.run(
            ["/bin/sh", "-c", request.command],
            timeout=float(request.timeoutSeconds),
            keep_bytes=KEEP_BYTES,
        )
    except WorkspaceError as exc:
        return CheckResult(exitCode=-1, output=f"the check could not run: {exc}", timedOut=False)
    return CheckResult(
        exitCode=outcome.exit_code,
        output=outcome.output[-CHECK_OUTPUT_CHARS:],
        timedOut=outcome.timed_out,
    )
