"""The one local approval store: a JSON file per request, where no cluster holds Approvals.

Used wherever there are no Approval resources: by the custodian of `corral run` (its gate
requests), by a harness started without a custodian (the wire tests), and by `corral run`'s
desk, which decides them. A record binds to a scope (the session or conversation that asked)
and to the digest of the exact call; a decision must name both, so a decision meant for
another session or another call releases nothing (docs/approvals.md: a decision counts only for
its own session).

Record fields: id, scope, submissionId, toolUseId, tool, input, digest, reason, and decision
(null while pending, then "approved" or "denied") with decidedBy and, when the person gave
one, comment (why they decided so).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any, Literal

from corral_api.digest import action_digest

Verdict = Literal["approved", "denied"]
_ID = re.compile(r"^apr_[0-9a-f]{16}$")


class ApprovalNotFound(KeyError):
    pass


class ApprovalScopeMismatch(PermissionError):
    pass


class ApprovalFiles:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def path(self, approval_id: str) -> Path:
        if not _ID.match(approval_id):
            raise ApprovalNotFound(approval_id)  # never a path outside the directory
        return self.directory / f"{approval_id}.json"

    def create(
        self,
        *,
        scope: str,
        tool: str,
        arguments: dict[str, Any],
        reason: str,
        submission_id: str = "",
        tool_use_id: str = "",
    ) -> dict[str, Any]:
        record = {
            "id": f"apr_{uuid.uuid4().hex[:16]}",
            "scope": scope,
            "submissionId": submission_id,
            "toolUseId": tool_use_id,
            "tool": tool,
            "input": arguments,
            "digest": action_digest(tool, arguments),
            "reason": reason,
            "decision": None,
            "decidedBy": None,
        }
        self._write(record)
        return record

    def read(self, approval_id: str) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.path(approval_id).read_text("utf-8"))
        except FileNotFoundError:
            raise ApprovalNotFound(approval_id) from None
        return data

    def decision(self, approval_id: str, *, scope: str) -> Verdict | None:
        """The decision of a request made in `scope`: None while pending (or being rewritten).

        A record of another scope, or whose digest does not match its own call, is not found."""
        try:
            record = self.read(approval_id)
        except ValueError:
            return None  # a decision being written; read again
        if record.get("scope") != scope or record.get("digest") != action_digest(
            str(record.get("tool")), record.get("input")
        ):
            raise ApprovalNotFound(approval_id)
        decision = record.get("decision")
        return decision if decision in ("approved", "denied") else None

    def pending(self) -> list[dict[str, Any]]:
        if not self.directory.is_dir():
            return []
        records = [json.loads(p.read_text("utf-8")) for p in sorted(self.directory.glob("*.json"))]
        return [r for r in records if not r.get("decision")]

    def decide(
        self,
        approval_id: str,
        verdict: Verdict,
        *,
        by: str,
        scope: str | None = None,
        digest: str | None = None,
        comment: str = "",
    ) -> dict[str, Any]:
        """Record a person's decision (and their reason, `comment`). `scope` and `digest`, when
        given, must be the request's: a decision written for another session or another call
        is refused."""
        if verdict not in ("approved", "denied"):
            raise ValueError(f"decision must be 'approved' or 'denied', got {verdict!r}")
        record = self.read(approval_id)
        if (scope is not None and record.get("scope") != scope) or (
            digest is not None and record.get("digest") != digest
        ):
            raise ApprovalScopeMismatch(
                f"approval {approval_id} belongs to another session or another call"
            )
        if record.get("decision"):
            raise ValueError(f"approval {approval_id} is already {record['decision']}")
        record["decision"] = verdict
        record["decidedBy"] = by
        if comment:
            record["comment"] = comment
        self._write(record)
        return record

    def _write(self, record: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(str(record["id"]))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
