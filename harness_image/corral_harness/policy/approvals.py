"""A local approval store: the ApprovalPort used until (and where) the custodian is absent.

Each pending approval is a JSON file under the store's directory, so a person or a test can
decide from another process. A decision binds to the scope (conversation) and the digest of the
exact call; a decision written for another scope or another call releases nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any, Literal

from corral_api.digest import action_digest

from ..seams import ApprovalPort, ToolCall, ToolDecision, TurnContext

Decision = Literal["approved", "denied"]


def call_digest(name: str, arguments: dict[str, Any]) -> str:
    """The digest an Approval binds to (the same function the custodian uses)."""
    return action_digest(name, arguments)


class ApprovalNotFound(KeyError):
    pass


class ApprovalScopeMismatch(PermissionError):
    pass


class LocalApprovalStore:
    def __init__(self, directory: str | os.PathLike[str], *, poll_seconds: float = 0.02) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.poll_seconds = poll_seconds

    def _path(self, approval_id: str) -> Path:
        if not approval_id.isalnum():
            raise ApprovalNotFound(approval_id)
        return self.directory / f"{approval_id}.json"

    def _read(self, approval_id: str) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self._path(approval_id).read_text())
        except FileNotFoundError:
            raise ApprovalNotFound(approval_id) from None
        return data

    def _write(self, record: dict[str, Any]) -> None:
        path = self._path(record["id"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, sort_keys=True))
        os.replace(tmp, path)

    async def request(self, ctx: TurnContext, call: ToolCall, reason: str) -> str:
        approval_id = uuid.uuid4().hex
        self._write(
            {
                "id": approval_id,
                "scope": ctx.conversation,
                "submissionId": ctx.submission_id,
                "toolUseId": call.id,
                "tool": call.name,
                "arguments": call.input,
                "digest": call_digest(call.name, call.input),
                "reason": reason,
                "decision": "pending",
            }
        )
        return approval_id

    def pending(self) -> list[dict[str, Any]]:
        records = [json.loads(p.read_text()) for p in sorted(self.directory.glob("*.json"))]
        return [r for r in records if r["decision"] == "pending"]

    def decide(self, approval_id: str, decision: Decision, *, scope: str, digest: str) -> None:
        """A human's decision; it must name the same scope and call digest as the request."""
        if decision not in ("approved", "denied"):
            raise ValueError(f"decision must be 'approved' or 'denied', got {decision!r}")
        record = self._read(approval_id)
        if record["scope"] != scope or record["digest"] != digest:
            raise ApprovalScopeMismatch(
                f"approval {approval_id} belongs to another session or another call"
            )
        if record["decision"] != "pending":
            raise ValueError(f"approval {approval_id} is already {record['decision']}")
        record["decision"] = decision
        self._write(record)

    async def wait(self, approval_id: str) -> Decision:
        while True:
            decision = self._read(approval_id)["decision"]
            if decision in ("approved", "denied"):
                return "approved" if decision == "approved" else "denied"
            await asyncio.sleep(self.poll_seconds)


async def settle_ask(
    decision: ToolDecision, ctx: TurnContext, call: ToolCall, port: ApprovalPort
) -> ToolDecision:
    """Turn an `ask` into allow or deny through a human; the same call (same input) replays."""
    if decision.outcome != "ask":
        return decision
    approval_id = await port.request(ctx, call, decision.reason)
    verdict = await port.wait(approval_id)
    if verdict == "approved":
        return ToolDecision("allow", f"approved by a human ({approval_id})", input=call.input)
    return ToolDecision("deny", f"denied by a human ({approval_id})")
