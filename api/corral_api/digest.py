"""Digests that bind a decision to exactly what it decided on.

The action digest an Approval binds to (one exact tool call, nothing near it), and the
definition digest an Evidence verdict binds to (one check's command and image).

Shared by the harness policy, the custodian and the operator so all three compute the same
value for the same call.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(arguments: Any) -> str:
    """Key-sorted, whitespace-free JSON, so equal arguments always hash alike."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def action_digest(tool: str, arguments: Any) -> str:
    """`sha256:` + hex of sha256(tool name + canonical JSON of the arguments)."""
    payload = (tool + canonical_json(arguments)).encode("utf-8")
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def check_definition_digest(command: str, image: str | None) -> str:
    """`sha256:` + hex of the check's definition: a verdict counts only for what it ran."""
    payload = canonical_json({"command": command, "image": image or ""}).encode("utf-8")
    return "sha256:" + hashlib.sha256(payload).hexdigest()
