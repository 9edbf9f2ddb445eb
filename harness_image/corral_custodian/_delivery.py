"""Delivery: the session's work pushed to its own branch at the end of every turn.

The harness commits what the agent left, in the tools container and as the agent (the
custodian never runs git inside the agent-writable repository), then asks for delivery. The
custodian fetches that commit into its own mirror (`_git.GitPusher`: hooks, fsmonitor and
filters off), checks that it descends from the head it knows (the last revision it pushed,
else the Session's `spec.workspace.ref` as the remote has it), and pushes it to the session's
branch, fast-forward only. A commit that does not descend (the agent rewrote history) is
refused, and so is anything while a Freeze holds the session.

The record (`corral_api.wire.DeliveryRecord`) is kept on the state volume, so a restarted
custodian still knows its last push, and served to the operator on its own port
(`GET /v1/delivery`), which writes it to `Session.status.delivery` (docs/delivery.md).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from corral_api.wire import DeliverRequest, DeliveryRecord, DeliveryState

from ._git import GitPusher

log = logging.getLogger("corral_custodian.delivery")

RECORD_FILE = "delivery.json"
_OUTPUT_LIMIT = 600


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _short(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _OUTPUT_LIMIT else "..." + text[-_OUTPUT_LIMIT:]


class Deliveries:
    """The delivery record and the one delivery at a time that may change it."""

    def __init__(self, pusher: GitPusher | None, branch: str | None, state_dir: Path | None):
        self._pusher = pusher
        self._branch = branch
        self._file = state_dir / RECORD_FILE if state_dir is not None else None
        self._lock = asyncio.Lock()
        self.record: DeliveryRecord | None = self._load()

    def _load(self) -> DeliveryRecord | None:
        if self._file is None or not self._file.exists():
            return None
        try:
            return DeliveryRecord.model_validate_json(self._file.read_text())
        except (OSError, ValidationError) as err:
            # Without the record the known head falls back to the base: never less strict.
            log.warning("the delivery record %s is unreadable: %s", self._file, err)
            return None

    def _save(self, record: DeliveryRecord) -> DeliveryRecord:
        self.record = record
        if self._file is not None:
            self._file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._file.with_suffix(".tmp")
            tmp.write_text(record.model_dump_json())
            tmp.replace(self._file)
        return record

    def _outcome(
        self,
        state: DeliveryState,
        message: str,
        request: DeliverRequest,
        *,
        attempted: str | None = None,
        pushed: str | None = None,
        no_remote: bool = False,
    ) -> DeliveryRecord:
        last = self.record
        return self._save(
            DeliveryRecord(
                state=state,
                branch=self._branch or "",
                revision=pushed or (last.revision if last else None),
                pushedAt=_now() if pushed else (last.pushedAt if last else None),
                attempted=attempted,
                message=message,
                submissionId=request.submissionId,
                deliveries=(last.deliveries if last else 0) + 1,
                noRemote=no_remote,
            )
        )

    async def deliver(
        self, request: DeliverRequest, base_ref: str, *, frozen: str | None = None
    ) -> DeliveryRecord:
        """Deliver the harness's commit (or the workspace's HEAD when it made none).

        `base_ref` is the Session's `spec.workspace.ref`, read from the cluster by the caller;
        `frozen` describes the Freeze that holds the session, if one does.
        """
        async with self._lock:
            return await self._deliver(request, base_ref, frozen)

    async def _deliver(
        self, request: DeliverRequest, base_ref: str, frozen: str | None
    ) -> DeliveryRecord:
        pusher, branch = self._pusher, self._branch
        if pusher is None or not branch:
            what = "CORRAL_WORKSPACE" if pusher is None else "CORRAL_SESSION_BRANCH"
            return self._outcome(
                "Failed", f"delivery is not configured: {what} is not set", request
            )
        refused = pusher.remote_refusal()
        if refused is not None:
            # What was committed is still named: under `corral run` a child starts from it.
            return self._outcome(
                "Failed", refused, request, no_remote=True, attempted=request.revision
            )
        if frozen is not None:
            return self._outcome(
                "Failed", f"not pushed: the session is {frozen}; the work is delivered with "
                "the first turn after the freeze", request,
            )  # fmt: skip
        fetched = await pusher.fetch_workspace()
        if not fetched.ok:
            return self._outcome("Failed", _short(fetched.output), request)
        revision = request.revision or fetched.revision
        if not await pusher.has_commit(revision):
            return self._outcome(
                "Failed", f"revision {revision} is not a commit of the workspace", request
            )
        known = self.record.revision if self.record is not None else None
        if known is None:
            base = await pusher.fetch_base(base_ref)
            if not base.ok:
                return self._outcome("Failed", _short(base.output), request, attempted=revision)
            known = base.revision
        if revision == known:
            return self._outcome(
                "NothingToDeliver", f"nothing new since {known}", request, attempted=revision
            )
        if not await pusher.descends(known, revision):
            return self._outcome(
                "Failed",
                f"refused: {revision} does not descend from {known}, the head this session's "
                "branch is known to have; history was rewritten",
                request,
                attempted=revision,
            )
        pushed = await pusher.push_to(revision, branch)
        if not pushed.ok:
            return self._outcome(
                "Failed",
                f"git push to {branch} failed: {_short(pushed.output)}",
                request,
                attempted=revision,
            )
        return self._outcome(
            "Delivered", f"pushed {revision} to {branch}", request,
            attempted=revision, pushed=revision,
        )  # fmt: skip
