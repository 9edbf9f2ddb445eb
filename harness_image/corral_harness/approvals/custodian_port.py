"""Approvals in a pod: the custodian creates the Approval resource and reports its decision.

The harness holds no cluster identity, so an `ask` goes to the custodian's Menu endpoint
`request_approval` (which creates an Approval bound to this session's name and uid) and the
decision is read back from `GET /approvals/{name}`, which answers only for this session's
Approvals. A person decides with `corral approve NAME` / `corral deny NAME` (docs/approvals.md).
Without a cluster (`corral run`) the custodian keeps the request in its local file store.

The request carries `X-Corral-Approval-Gate: 1`: it is the policy's gate asking about a call
the allowlist already let through, so the custodian does not hold it to the Agent's allowlist
the way it holds a model's own `mcp__corral__request_approval` call.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
from typing import Any, Literal

from ..ports import ToolCall, TurnContext

log = logging.getLogger(__name__)

_UNREACHABLE = "unreachable:"
GATE_HEADER = "X-Corral-Approval-Gate"


class CustodianApprovalPort:
    def __init__(
        self,
        base_url: str,
        poll_seconds: float = 1.0,
        timeout: float = 30.0,
        *,
        credential: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.poll_seconds = poll_seconds
        self._httpx: Any = importlib.import_module("httpx")
        headers = {"authorization": f"Bearer {credential}"} if credential else {}
        self._client = self._httpx.AsyncClient(timeout=timeout, headers=headers)

    async def request(self, ctx: TurnContext, call: ToolCall, reason: str) -> str:
        body = {"tool": call.name, "arguments": call.input, "reason": reason}
        try:
            response = await self._client.post(
                f"{self.base_url}/agents/{ctx.conversation}/tools/request_approval",
                json=body,
                headers={"X-Corral-Submission": ctx.submission_id, GATE_HEADER: "1"},
            )
            answer = response.json()
            if answer.get("isError"):
                raise ValueError(answer.get("content", "refused"))
            return str(json.loads(answer["content"])["approval"])
        except (self._httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            # No approval could be created: the call stays blocked (wait() answers denied).
            log.warning("approval request failed: %s", exc)
            return f"{_UNREACHABLE}{exc}"

    async def wait(self, approval_id: str) -> Literal["approved", "denied"]:
        if approval_id.startswith(_UNREACHABLE):
            return "denied"
        while True:
            try:
                response = await self._client.get(f"{self.base_url}/approvals/{approval_id}")
                if response.status_code == 200:
                    answer = response.json()
                    decision = str(answer.get("decision", "Pending"))
                    # `ready: false`: approved, but the machine check beside the human (the
                    # Evidence of a landing check) has no verdict yet; the call waits for it.
                    if decision == "Approved" and answer.get("ready", True) is not False:
                        return "approved"
                    if decision == "Denied":
                        return "denied"
                elif response.status_code == 404:
                    return "denied"  # not this session's Approval, or deleted
            except (self._httpx.HTTPError, ValueError) as exc:
                log.warning("reading approval %s failed: %s", approval_id, exc)
            await asyncio.sleep(self.poll_seconds)
