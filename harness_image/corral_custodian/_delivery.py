"""Delivery: the session's work pushed to its own branch at the end of every turn.

The harness commits what the agent left, in the tools container and as the agent, then has
the tools side write a git bundle of the commits since the base the custodian names
(`GET /agents/{c}/bundle-base`, `bundle_base` here) and streams it to the custodian
(`POST /agents/{c}/bundle`), which checks it and unpacks it into its own mirror
(`_git.GitPusher.take_bundle`). Only then does it ask for delivery. The custodian never mounts
or opens the workspace: it runs git only in its own mirror, on bytes it checked itself, so no
file, config or symlink the agent left is ever resolved by a process holding a credential.

Delivery takes the revision the harness names only if the mirror holds it (it was sent),
checks that it descends from the head the custodian knows (the last revision it pushed, else
the Session's `spec.workspace.ref` as the remote has it), and pushes it to the session's
branch, fast-forward only. A commit that does not descend (the agent rewrote history) is
refused, and so is anything while a Freeze holds the session. Failures are worded in
`_git.REASONS`, never in git's raw output.

The record (`corral_api.wire.DeliveryRecord`) is kept on the state volume, so a restarted
custodian still knows its last push, and served to the operator on its own port
(`GET /v1/delivery`), which writes it to `Session.status.delivery` (docs/delivery.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

from pydantic import ValidationError

from corral_api.timestamps import now_rfc3339
from corral_api.wire import BundleBase, DeliverRequest, DeliveryRecord, DeliveryState

from ._git import GitPusher, GitResult
from .facts import SessionFacts

log = logging.getLogger("corral_custodian.delivery")

RECORD_FILE = "delivery.json"


class BaseUnavailable(Exception):
    """The base a bundle should start from cannot be established (the remote's ref)."""

    def __init__(self, result: GitResult) -> None:
        super().__init__(result.message)
        self.result = result


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
                pushedAt=now_rfc3339() if pushed else (last.pushedAt if last else None),
                attempted=attempted,
                message=message,
                submissionId=request.submissionId,
                deliveries=(last.deliveries if last else 0) + 1,
                noRemote=no_remote,
            )
        )

    async def bundle_base(self, base_ref: str, conversation: str) -> BundleBase:
        """The revision the mirror holds as this session's known head, which the harness's
        next bundle needs only the commits after: the last push, else the Session's
        `spec.workspace.ref` fetched from the remote; with no remote to push to, the
        conversation's last sent tip; None when there is none of these (an empty remote):
        the bundle must then be complete.

        Raises BaseUnavailable when the remote's ref cannot be read."""
        pusher, branch = self._pusher, self._branch or ""
        if pusher is None:
            return BundleBase(base=None, branch=branch)
        async with self._lock:
            if pusher.remote_refusal() is not None:
                return BundleBase(base=await pusher.sent(conversation), branch=branch)
            known = await pusher.pushed()
            last = self.record.revision if self.record is not None else None
            if known is None and last is not None and await pusher.has_commit(last):
                known = last
            if known is None:
                fetched = await pusher.fetch_base(base_ref)
                if fetched.reason == "ref_not_found":
                    # An empty remote (or one without the ref): nothing to start from, the
                    # bundle is complete; delivery then says why it cannot check descent.
                    return BundleBase(base=None, branch=branch)
                if not fetched.ok:
                    raise BaseUnavailable(fetched)
                known = fetched.revision
            return BundleBase(base=known, branch=branch)

    async def deliver(
        self,
        request: DeliverRequest,
        base_ref: str,
        *,
        frozen: str | None = None,
        conversation: str = "",
        protected: str | None = None,
    ) -> DeliveryRecord:
        """Deliver the harness's commit (or, when it named none, the conversation's last sent
        tip), which must be in the custodian's mirror: the harness sent it as a bundle.

        `base_ref` is the Session's `spec.workspace.ref`, read from the cluster by the caller;
        `frozen` describes the Freeze that holds the session, if one does; `protected` why its
        branch may receive nothing (`rules.branch_refusal`: outside the Agent's
        spec.workspace.branches, or the branch its ref names).
        """
        async with self._lock:
            return await self._deliver(request, base_ref, frozen, conversation, protected)

    async def _deliver(
        self,
        request: DeliverRequest,
        base_ref: str,
        frozen: str | None,
        conversation: str,
        protected: str | None = None,
    ) -> DeliveryRecord:
        pusher, branch = self._pusher, self._branch
        if pusher is None or not branch:
            return self._outcome(
                "Failed", "delivery is not configured: CORRAL_SESSION_BRANCH is not set", request
            )
        refused = pusher.remote_refusal()
        if refused is not None:
            # What was committed is still named: under `corral run` a child starts from it.
            return self._outcome(
                "Failed", refused, request, no_remote=True, attempted=request.revision
            )
        if protected is not None:
            return self._outcome("Failed", protected, request, attempted=request.revision)
        if frozen is not None:
            return self._outcome(
                "Failed", f"not pushed: the session is {frozen}; the work is delivered with "
                "the first turn after the freeze", request,
            )  # fmt: skip
        revision = request.revision or await pusher.sent(conversation)
        if revision is None:
            return self._outcome(
                "Failed", "not delivered: revision_not_sent: no revision was sent", request
            )
        if not await pusher.has_commit(revision):
            return self._outcome(
                "Failed",
                f"not delivered: revision_not_sent: revision {revision} was not sent",
                request,
                attempted=revision,
            )
        known = self.record.revision if self.record is not None else None
        if known is None:
            base = await pusher.fetch_base(base_ref)
            if not base.ok:
                return self._outcome("Failed", base.message, request, attempted=revision)
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
                f"git push to {branch} failed: {pushed.message}",
                request,
                attempted=revision,
            )
        return self._outcome(
            "Delivered", f"pushed {revision} to {branch}", request,
            attempted=revision, pushed=revision,
        )  # fmt: skip


async def with_remote_head(facts: SessionFacts, pusher: GitPusher | None) -> SessionFacts:
    """`facts` with the branch a `HEAD` ref resolves to on the remote among the ref's branches,
    so `rules.branch_refusal` refuses it as the session branch as the checkout does."""
    if pusher is None or (facts.ref not in (None, "", "HEAD")):
        return facts
    head = await pusher.remote_default_branch()
    if head is None or head in facts.ref_branches:
        return facts
    return dataclasses.replace(facts, ref_branches=(*facts.ref_branches, head))
