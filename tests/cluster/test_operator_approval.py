"""Approvals on the real API server: the operator announces an Approval and checks it binds to
a live Session, never deciding it. (Goals: test_operator_goal.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests._objects import approval

from .._scripted import tool_results
from ._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)
from .test_approvals_end_to_end import People, corral, people  # noqa: F401 - a fixture

pytestmark = pytest.mark.timeout(180)


def _approval(name: str, session: str, uid: str) -> dict[str, Any]:
    """An Approval of a land call (its digest a placeholder: nothing here decides it)."""
    return approval(name, session, uid, arguments={}, digest="sha256:" + "a" * 64)


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
    for asked in ("good", "forged"):
        body = operator.get("approval", asked) or {}
        assert "status" not in body or body["status"].get("decision") in (None, "Pending")


def test_a_session_waits_for_a_person_then_replays_the_call_after_corral_approve(
    operator: OperatorHandle,
    scripted_model: ScriptedModelHandle,
    git_repo: Path,
    people: People,  # noqa: F811 - the fixture imported above
) -> None:
    """In a real sandbox pod: `git merge` asks once (the custodian creates one Approval), the
    Session reads WaitingForHuman while it is pending, and a person's `corral approve` lets the
    same call run."""
    name = f"{operator.namespace}-merge"
    merge = {"command": "git merge --ff-only main && echo MERGED"}
    scripted_model.load(
        {
            "conversations": {
                name: [
                    {"text": "Merging main.", "tool_use": {"name": "bash", "input": merge}},
                    {
                        "when": {"tool_result_contains": "MERGED"},
                        "text": "Merged.",
                        "otherwise": {"text": "Not merged."},
                    },
                ]
            }
        }
    )
    operator.apply(agent_doc(), session_doc(name, git_repo))
    waiting = operator.wait_phase(name, {"WaitingForHuman"})
    progressing = next(c for c in waiting["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "WaitingForHuman")
    assert "waits for a person" in progressing["message"]

    def mine() -> list[dict[str, Any]]:
        found = operator.cp.kubectl("get", "approvals", "-n", operator.namespace, "-o", "json")
        items = json.loads(found.stdout)["items"]
        return [a for a in items if a["spec"]["sessionRef"]["name"] == name]

    (approval,) = mine()
    assert approval["spec"]["action"]["tool"] == "bash"
    assert json.loads(approval["spec"]["action"]["arguments"]) == merge
    time.sleep(2)  # still waiting, still one request
    assert operator.session_status(name)["phase"] == "WaitingForHuman" and len(mine()) == 1

    approved = corral(
        "approve", approval["metadata"]["name"], kubeconfig=people.alice,
        namespace=operator.namespace,
    )  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    assert status["turns"] == 1
    results = tool_results(scripted_model.requests(name))
    assert any("MERGED" in r for r in results), results
    assert len(mine()) == 1
