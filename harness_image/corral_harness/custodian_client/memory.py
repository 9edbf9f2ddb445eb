"""Long-term memory through the custodian, which owns the store (docs/memory.md).

`POST $CORRAL_CUSTODIAN_URL/memory/recall {query, limit}` answers `{facts: [...], lines: [...]}`
and `POST .../memory/extract {text}` hands it an accepted turn's answer. The harness names no
scope and holds no database credential: the custodian derives the scope from the Agent it reads
itself and confines it to its Session's namespace. Writing is the model's, through the Menu's
memory tools. Short timeouts: recall sits before every model call and is fail-open.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..ports import TurnContext

if TYPE_CHECKING:
    import httpx

    from ..memory import MemorySource


class MemoryRefused(Exception):
    """The custodian answered memory with an error (logged by the fail-open hooks)."""


class CustodianMemory:
    def __init__(
        self, base_url: str, timeout: float = 5.0, *, credential: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._httpx: Any = importlib.import_module("httpx")
        headers = {"authorization": f"Bearer {credential}"} if credential else {}
        self._client: httpx.AsyncClient = self._httpx.AsyncClient(timeout=timeout, headers=headers)

    async def _post(self, path: str, body: dict[str, Any], submission: str = "") -> Any:
        response = await self._client.post(
            f"{self.base_url}{path}",
            json=body,
            headers={"X-Corral-Submission": submission} if submission else None,
        )
        if response.status_code != 200:
            raise MemoryRefused(f"{path}: {response.status_code} {response.text[:300]}")
        return response.json()

    async def recall_lines(self, query: str, limit: int) -> list[str]:
        answer = await self._post("/memory/recall", {"query": query, "limit": limit})
        return [str(line) for line in answer.get("lines") or []]

    async def extract(self, final_text: str, submission_id: str) -> None:
        await self._post("/memory/extract", {"text": final_text}, submission_id)

    def for_turn(self, ctx: TurnContext) -> MemorySource | None:
        """This memory when the turn's Agent has memory on; else none (no round trip)."""
        memory = ctx.agent.memory
        return self if memory is not None and memory.enabled else None

    async def close(self) -> None:
        await self._client.aclose()
