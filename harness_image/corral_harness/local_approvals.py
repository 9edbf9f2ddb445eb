"""A local approval store: one JSON file per approval in `<state>/approvals/`.

A human (or a test) decides by writing `"decision": "approved"` or `"denied"` into the file.
In a pod the custodian is the approval port (Approval resources); this one serves a harness run
on a workstation and the conformance suite.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Literal

from .seams import ToolCall, TurnContext


class FileApprovalPort:
    def __init__(self, directory: Path, poll_seconds: float = 0.1) -> None:
        self.directory = directory
        self.poll_seconds = poll_seconds

    def path(self, approval_id: str) -> Path:
        return self.directory / f"{approval_id}.json"

    async def request(self, ctx: TurnContext, call: ToolCall, reason: str) -> str:
        approval_id = f"apr_{uuid.uuid4().hex[:16]}"
        self.directory.mkdir(parents=True, exist_ok=True)
        record = {
            "id": approval_id,
            "conversation": ctx.conversation,
            "submissionId": ctx.submission_id,
            "tool": call.name,
            "input": call.input,
            "reason": reason,
            "decision": None,
        }
        tmp = self.path(approval_id).with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
        os.replace(tmp, self.path(approval_id))
        return approval_id

    async def wait(self, approval_id: str) -> Literal["approved", "denied"]:
        while True:
            try:
                decision = json.loads(self.path(approval_id).read_text("utf-8")).get("decision")
            except (OSError, ValueError):
                decision = None  # a file being rewritten; look again
            if decision == "approved":
                return "approved"
            if decision == "denied":
                return "denied"
            await asyncio.sleep(self.poll_seconds)
