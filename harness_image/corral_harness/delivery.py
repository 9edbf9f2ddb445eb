"""The end of a turn: commit what the agent left, then ask the custodian to deliver it.

The commit runs through the `Workspace` port, so in a pod it runs in the tools container as
the agent's uid (the exec service), never in the custodian, which holds the credentials: the
agent's hooks, `core.fsmonitor` and filters may run there, and that is the agent's own
sandbox. The custodian then fetches the commit into its own mirror and pushes it
(`corral_custodian._delivery`, docs/delivery.md). Without a custodian (`corral run` with no
remote, the wire tests) the commit stays on the local branch.

The commit's author is the agent (`<agent> <agent@agents.corral.invalid>`), its message the
task's first line and the turn's answer; `--no-verify` and `core.hooksPath=/dev/null`, since a
commit the harness makes on the agent's behalf should not be vetoed or rewritten by a hook the
agent planted.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any

from .seams import Workspace, WorkspaceError

log = logging.getLogger(__name__)

GIT_TIMEOUT = 60.0
SUBJECT_LIMIT = 72
ANSWER_LIMIT = 4000
_KEEP = 64_000
# Protected configuration (the command line) that the agent's repository cannot override:
# the workspace's top directory may belong to another uid (the volume's), and the harness's
# own commit runs no hook.
_GIT = (
    "git",
    "-c", "safe.directory=*",
    "-c", "core.hooksPath=/dev/null",
    "-c", "commit.gpgSign=false",
    "-c", "core.fsmonitor=false",
)  # fmt: skip


@dataclass(frozen=True)
class Committed:
    revision: str | None  # HEAD after the commit; None when the root is not in a repository
    changed: bool  # this turn left changes that are now committed


def commit_message(task: str, answer: str, conversation: str, submission: str) -> str:
    """The subject is the task's first line, the body the turn's answer, then trailers."""
    first = next((line.strip() for line in task.splitlines() if line.strip()), "agent turn")
    subject = first if len(first) <= SUBJECT_LIMIT else first[: SUBJECT_LIMIT - 3] + "..."
    body = answer.strip()
    if len(body) > ANSWER_LIMIT:
        body = body[: ANSWER_LIMIT - 3] + "..."
    parts = [subject]
    if body:
        parts.append(body)
    parts.append(f"Corral-Session: {conversation}\nCorral-Submission: {submission}")
    return "\n\n".join(parts) + "\n"


def task_of(transcript: list[dict[str, Any]]) -> str:
    """The conversation's first user text: the task the session was started with."""
    for message in transcript:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        for block in content or []:
            if isinstance(block, dict) and block.get("type") == "text":
                return str(block.get("text", ""))
    return ""


class TurnDelivery:
    """Commit in the workspace, then hand the commit to the custodian (when there is one)."""

    def __init__(
        self,
        workspace: Workspace,
        custodian_url: str | None,
        *,
        credential: str | None = None,
        timeout: float = 180.0,
    ) -> None:
        self._workspace = workspace
        self._url = custodian_url.rstrip("/") if custodian_url else None
        self._client: Any = None
        if self._url:
            self._httpx: Any = importlib.import_module("httpx")
            headers = {"authorization": f"Bearer {credential}"} if credential else {}
            self._client = self._httpx.AsyncClient(timeout=timeout, headers=headers)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def _git(self, *args: str) -> tuple[int, str]:
        outcome = await self._workspace.run([*_GIT, *args], timeout=GIT_TIMEOUT, keep_bytes=_KEEP)
        return outcome.exit_code, outcome.output.strip()

    async def commit(self, agent: str, message: str) -> Committed:
        """Commit everything the agent left (new, changed and deleted files) as the agent."""
        code, inside = await self._git("rev-parse", "--is-inside-work-tree")
        if code != 0 or inside != "true":
            return Committed(None, False)
        code, changes = await self._git("status", "--porcelain", "--untracked-files=all")
        changed = code == 0 and bool(changes)
        if changed:
            ident = ("-c", f"user.name={agent}", "-c", f"user.email={agent}@agents.corral.invalid")
            code, out = await self._git("add", "-A")
            if code == 0:
                code, out = await self._git(
                    *ident, "commit", "-q", "--no-verify", "--allow-empty-message", "-m", message
                )
            if code != 0:
                log.warning("the turn's commit failed: %s", out[-500:])
                changed = False
        code, head = await self._git("rev-parse", "--verify", "-q", "HEAD^{commit}")
        return Committed(head if code == 0 and len(head) == 40 else None, changed)

    async def deliver(self, conversation: str, submission: str, revision: str | None) -> None:
        """Ask the custodian to push `revision`; its record says how that went (the operator
        reads it), so an unreachable custodian is logged, not raised."""
        if self._client is None:
            return
        body: dict[str, Any] = {"submissionId": submission}
        if revision is not None:
            body["revision"] = revision
        try:
            answer = await self._client.post(
                f"{self._url}/agents/{conversation}/deliver", json=body
            )
            if answer.status_code != 200:
                log.warning("delivery refused (%s): %s", answer.status_code, answer.text[:300])
        except self._httpx.HTTPError as exc:
            log.warning("delivery failed: the custodian is unreachable: %s", exc)

    async def end_turn(
        self, *, agent: str, conversation: str, submission: str, task: str, answer: str
    ) -> str | None:
        """Commit and deliver; the revision delivered (None: no repository)."""
        message = commit_message(task, answer, conversation, submission)
        try:
            committed = await self.commit(agent, message)
        except WorkspaceError as exc:
            log.warning("the turn's commit could not run: %s", exc)
            return None
        if committed.revision is None:
            return None
        await self.deliver(conversation, submission, committed.revision)
        return committed.revision
