"""Approvals and Goals on the real API server: the operator announces an Approval and checks it
binds to a live Session, never deciding it; a Goal's status is initialised."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ._operator_fixtures import (
    OperatorHandle,
    agent_doc,
    session_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)


def _approval(name: str, session: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Approval",
        "metadata": {"name": name},
        "spec": {
            "sessionRef": {"name": session, "uid": uid},
            "action": {"tool": "land", "arguments": "{}", "digest": "sha256:" + "a" * 64},
        },
    }


def _event_reasons(op: OperatorHandle, name: str) -> list[str]:
    return [e["reason"] for e in op.events(name)]


def test_an_approval_is_announced_and_checked_against_its_session_but_never_decided(
    operator: OperatorHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-asks"
    # A Session for a missing Agent: it exists (and has a uid) but never runs a turn.
    operator.apply(session_doc(name, git_repo, agent="absent"))
    session = wait_for("the session", lambda: operator.get("session", name))
    uid = session["metadata"]["uid"]

    operator.apply(_approval("good", name, uid), _approval("forged", name, "not-its-uid"))
    wait_for("the request event", lambda: "ApprovalRequested" in _event_reasons(operator, "good"))
    wait_for("the mismatch event", lambda: "SessionMismatch" in _event_reasons(operator, "forged"))
    for approval in ("good", "forged"):
        body = operator.get("approval", approval) or {}
        assert "status" not in body or body["status"].get("decision") in (None, "Pending")


def test_a_goal_gets_its_status_initialised(operator: OperatorHandle, git_repo: Path) -> None:
    template = session_doc("unused", git_repo)["spec"]
    goal = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Goal",
        "metadata": {"name": "green"},
        "spec": {
            "description": "tests pass",
            "success": {"name": "unit", "command": "true"},
            "sessionTemplate": {"spec": template},
        },
    }
    operator.apply(agent_doc(), goal)
    status = wait_for(
        "the goal's status", lambda: (operator.get("goal", "green") or {}).get("status")
    )
    assert status["verdict"] == "Pending" and status["waves"] == 0
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
