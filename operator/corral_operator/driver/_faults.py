"""Typed faults of the wire, as the turn driver sees them.

They live here, not in the httpx adapter, so the pure driver can catch them without importing
an HTTP library; `corral_operator.wireclient` re-exports them for its callers.
"""

from __future__ import annotations

from typing import Any

from corral_api.wire import SettledEvent


class WireFault(Exception):
    """Something on the wire did not go as the contract says."""


class SettlementFault(WireFault):
    """The submission settled `failed`, `ended` or `aborted`; `settled` says how."""

    def __init__(self, settled: SettledEvent) -> None:
        self.settled = settled
        detail = f": {settled.error.type}: {settled.error.message}" if settled.error else ""
        super().__init__(f"submission {settled.submissionId} settled {settled.status}{detail}")


class ConversationLost(WireFault):
    """The harness answered 404: it does not know the conversation (any more)."""

    def __init__(self, conversation: str, reason: str = "") -> None:
        self.conversation = conversation
        self.reason = reason
        super().__init__(f"conversation {conversation!r} is unknown to the harness: {reason}")


class AdmissionRejected(WireFault):
    """The harness refused the submission with a 4xx; `reason` is its own words."""

    def __init__(self, status_code: int, reason: str, body: dict[str, Any] | None = None) -> None:
        self.status_code = status_code
        self.reason = reason
        self.body = body or {}
        super().__init__(f"admission rejected ({status_code}): {reason}")


class WireRequestFailed(WireFault):
    """A call other than admission got an answer the contract does not allow."""

    def __init__(self, what: str, status_code: int, reason: str) -> None:
        self.status_code = status_code
        self.reason = reason
        super().__init__(f"{what} failed ({status_code}): {reason}")


class WireVersionUnsupported(WireFault):
    """The harness speaks a wire version this operator cannot drive (`wire_version_problem`):
    nothing of its answer is read."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(problem)


def byte_size(count: int) -> str:
    """A byte count as people read it: `64 MiB`, `1536 KiB`, `1000 bytes`."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return f"{count} bytes"


class AnswerTooLarge(WireFault):
    """The harness's answer ran past the operator's cap: the read stopped at the cap and the
    connection was closed; nothing of the answer is used."""

    def __init__(self, what: str, limit: int) -> None:
        self.what = what
        self.limit = limit
        super().__init__(
            f"the harness's {what} answer is larger than {byte_size(limit)} (the operator's "
            "--max-history-bytes, chart value operator.maxHistoryBytes): reading stopped there"
        )
