"""Deciding the harness's approvals during a local run.

Under `corral run` the custodian has no cluster, so its approval gate keeps each request in the
one local file store (`corral_common.approval_files`): `<state>/custodian/approvals/<id>.json`
(in a pod, Approval resources do this job). Without an answer the turn waits for ever, so
`corral run` answers each request by its `--approvals` mode: `ask` (a prompt on the terminal),
`approve`, `deny`, or `manual` (print the file's path and let someone else decide, e.g. with
`ApprovalFiles.decide`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from corral_common.approval_files import ApprovalFiles, ApprovalNotFound

Mode = Literal["ask", "approve", "deny", "manual"]
MODES: tuple[Mode, ...] = ("ask", "approve", "deny", "manual")
Verdict = Literal["approved", "denied"]


def default_mode(json_lines: bool) -> Mode:
    """Ask when a person is at the terminal; otherwise refuse (the safe answer)."""
    interactive = sys.stdin.isatty() and sys.stdout.isatty() and not json_lines
    return "ask" if interactive else "deny"


def describe_request(record: dict[str, Any]) -> str:
    args = json.dumps(record.get("input", {}), ensure_ascii=False)
    return f"{record.get('tool')} {args} ({record.get('reason') or 'no reason given'})"


Prompt = Callable[[str], str]


def _settle(answer: asyncio.Future[str], text: str) -> None:
    if not answer.done():
        answer.set_result(text)


class ApprovalDesk:
    """Answers `approval_requested` events for one run."""

    def __init__(
        self, directory: Path, mode: Mode, note: Callable[[str], None], prompt: Prompt = input
    ) -> None:
        self.files = ApprovalFiles(directory)
        self.mode = mode
        self._note = note
        self._prompt = prompt
        self._pending: set[asyncio.Future[str]] = set()

    def on_event(self, event: dict[str, Any]) -> None:
        if event.get("type") != "approval_requested" or event.get("source") == "driver":
            return
        approval_id = str(event.get("approvalId", ""))
        try:
            path = self.files.path(approval_id)
            record = self.files.read(approval_id)
        except (ApprovalNotFound, OSError, ValueError):
            self._note(f"approval {approval_id}: no such request in {self.files.directory}")
            return
        if record.get("decision"):
            return  # decided already (a re-attached run reads old events again)
        what = describe_request(record)
        if self.mode in ("approve", "deny"):
            verdict: Verdict = "approved" if self.mode == "approve" else "denied"
            self.files.decide(approval_id, verdict, by=f"corral run --approvals {self.mode}")
            self._note(f"approval {approval_id} {verdict} (--approvals {self.mode}): {what}")
        elif self.mode == "manual":
            self._note(
                f'approval {approval_id} waits: {what}; write "decision": "approved" or '
                f'"denied" into {path}'
            )
        else:
            self._ask(approval_id, what)

    def _ask(self, approval_id: str, what: str) -> None:
        # The prompt reads stdin in a daemon thread: the wire keeps being read meanwhile, and an
        # aborted turn does not leave the process waiting for an Enter that never comes.
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()
        self._pending.add(answer)

        def read() -> None:
            try:
                text = self._prompt(f"approve {what}? [y/N] ")
            except (EOFError, OSError):
                text = ""
            loop.call_soon_threadsafe(_settle, answer, text)

        def decided(done: asyncio.Future[str]) -> None:
            self._pending.discard(done)
            if done.cancelled():
                return
            verdict: Verdict = (
                "approved" if done.result().strip().lower() in ("y", "yes") else "denied"
            )
            try:
                self.files.decide(approval_id, verdict, by="a person at the terminal of corral run")
            except (OSError, ValueError, KeyError) as exc:
                self._note(f"approval {approval_id}: cannot record the decision: {exc}")
                return
            self._note(f"approval {approval_id} {verdict}")

        answer.add_done_callback(decided)
        threading.Thread(target=read, name=f"approval {approval_id}", daemon=True).start()

    def cancel(self) -> None:
        for pending in list(self._pending):
            pending.cancel()
