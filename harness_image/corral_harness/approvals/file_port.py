"""The approval port of a harness started without a custodian: the one local file store.

In a pod, and under `corral run`, the custodian is the approval port (Approval resources, or
its own file store when it has no cluster). A harness with no custodian at all (the wire tests,
a bare `corral-harness` on a workstation) keeps its requests in `<state>/approvals/` through
the same store (`corral_common.approval_files`), scoped to the conversation; a person or a test
decides with `ApprovalFiles.decide`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

from corral_common.approval_files import ApprovalFiles, ApprovalNotFound

from ..ports import ToolCall, TurnContext


class FileApprovalPort:
    def __init__(self, directory: Path, poll_seconds: float = 0.1) -> None:
        self.files = ApprovalFiles(directory)
        self.poll_seconds = poll_seconds
        self._scopes: dict[str, str] = {}

    @property
    def directory(self) -> Path:
        return self.files.directory

    async def request(self, ctx: TurnContext, call: ToolCall, reason: str) -> str:
        record = self.files.create(
            scope=ctx.conversation,
            tool=call.name,
            arguments=call.input,
            reason=reason,
            submission_id=ctx.submission_id,
            tool_use_id=call.id,
        )
        approval_id = str(record["id"])
        self._scopes[approval_id] = ctx.conversation
        return approval_id

    async def wait(self, approval_id: str) -> Literal["approved", "denied"]:
        scope = self._scopes.get(approval_id)
        if scope is None:
            return "denied"  # not a request this port made
        while True:
            try:
                decision = self.files.decision(approval_id, scope=scope)
            except ApprovalNotFound:
                return "denied"  # deleted, or rewritten to speak about something else
            if decision is not None:
                self._scopes.pop(approval_id, None)
                return decision
            await asyncio.sleep(self.poll_seconds)
