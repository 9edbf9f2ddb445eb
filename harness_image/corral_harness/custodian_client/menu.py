"""The Menu: control tools served by the custodian, read afresh for every submission.

`GET $CORRAL_CUSTODIAN_URL/agents/{conversation}/surface` lists them; calling one is
`POST .../tools/{name}` with the input as the body, answered {content, isError, endsTurn}. The
model sees each as `mcp__corral__<name>`.

`push` and `land` act on commits the custodian holds, and it never opens the workspace: before
either is invoked, the harness hands it the commits as a bundle the tools side writes
(`delivery.BundleSender`), up to HEAD for `push` and up to the land input's `revision` for
`land` (when the workspace has that commit; otherwise the custodian refuses it itself).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..delivery import BundleError, BundleSender
from ..ports import ToolSpec, Workspace, WorkspaceError

if TYPE_CHECKING:
    import httpx

PREFIX = "mcp__corral__"


class MenuUnavailable(Exception):
    pass


@dataclass(frozen=True)
class MenuAnswer:
    content: str
    is_error: bool
    ends_turn: bool


class MenuClient:
    def __init__(
        self,
        base_url: str | None,
        timeout: float = 30.0,
        *,
        credential: str | None = None,
        workspace: Workspace | None = None,
        bundle_timeout: float = 180.0,
    ) -> None:
        self.base_url = base_url
        self._client: httpx.AsyncClient | None = None
        self._bundles: BundleSender | None = None
        self._bundle_client: httpx.AsyncClient | None = None
        if base_url:
            # Imported here: a harness without a custodian should not pay for it at start.
            self._httpx = importlib.import_module("httpx")
            headers = {"authorization": f"Bearer {credential}"} if credential else {}
            self._client = self._httpx.AsyncClient(timeout=timeout, headers=headers)
            if workspace is not None:
                # A bundle may take longer to write and send than a Menu call to answer.
                self._bundle_client = self._httpx.AsyncClient(
                    timeout=bundle_timeout, headers=headers
                )
                self._bundles = BundleSender(workspace, self._bundle_client, base_url)

    async def surface(self, conversation: str) -> list[ToolSpec]:
        if self._client is None:
            return []
        try:
            response = await self._client.get(f"{self.base_url}/agents/{conversation}/surface")
            response.raise_for_status()
            tools = response.json()["tools"]
            return [
                ToolSpec(
                    name=PREFIX + str(t["name"]),
                    description=str(t.get("description", "")).splitlines()[0][:300]
                    if t.get("description")
                    else str(t["name"]),
                    input_schema=dict(t.get("input_schema") or {"type": "object"}),
                    kind="menu",
                    instructions=str(t.get("description", "")),
                    pick=bool(t.get("pick", False)),
                )
                for t in tools
            ]
        except (self._httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            raise MenuUnavailable(f"the Menu could not be read from the custodian: {exc}") from exc

    async def invoke(
        self, conversation: str, name: str, args: dict[str, Any], submission_id: str = ""
    ) -> MenuAnswer:
        if self._client is None:
            return MenuAnswer("no custodian is configured for this harness", True, False)
        bare = name.removeprefix(PREFIX)
        refused = await self._hand_over(conversation, bare, args)
        if refused is not None:
            return MenuAnswer(refused, True, False)
        try:
            response = await self._client.post(
                f"{self.base_url}/agents/{conversation}/tools/{bare}",
                json=args,
                headers={"X-Corral-Submission": submission_id} if submission_id else None,
            )
            body = response.json()
            return MenuAnswer(
                str(body.get("content", "")),
                bool(body.get("isError", response.status_code >= 400)),
                bool(body.get("endsTurn", False)),
            )
        except (self._httpx.HTTPError, ValueError, AttributeError) as exc:
            return MenuAnswer(f"the Menu tool {bare} could not be reached: {exc}", True, False)

    async def _hand_over(self, conversation: str, tool: str, args: dict[str, Any]) -> str | None:
        """Send the commits `push` or `land` acts on; the reason to answer instead of invoking
        the tool, or None. A failed hand-over is not papered over: the custodian would push
        the tip of an earlier bundle, not what the agent has now."""
        if self._bundles is None or tool not in ("push", "land"):
            return None
        try:
            if tool == "push":
                tip = await self._bundles.commit_of("HEAD")
            else:
                revision = args.get("revision")
                tip = await self._bundles.commit_of(revision) if isinstance(revision, str) else None
            if tip is None:
                return None  # nothing the workspace has: the custodian refuses it with reason
            await self._bundles.send(conversation, tip, is_head=tool == "push")
        except (BundleError, WorkspaceError) as exc:
            return (
                f"{tool} was not invoked: the commits could not be handed to the custodian: {exc}"
            )
        return None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._bundle_client is not None:
            await self._bundle_client.aclose()
