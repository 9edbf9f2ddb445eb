"""The turn's ledger and the runaway watch on the real API server, operator and local node:
`kubectl get sessions` shows the last turn's outcome, `status.lastTurn` the summary, and a turn
the runaway watch stopped fails the Session `TurnRunaway` (docs/ledger.md)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from ._operator_fixtures import OperatorHandle, ScriptedModelHandle, agent_doc, session_doc

pytestmark = pytest.mark.timeout(150)


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == kind)


def test_the_last_turn_is_in_status_and_in_kubectl_get(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Any
) -> None:
    name = "ledger-ok"
    echo = {"tool_use": {"name": "bash", "input": {"command": "echo hi"}}}
    scripted_model.load({"conversations": {name: [echo, {"text": "Done."}]}})
    operator.apply(
        agent_doc("ledger-coder", loop="reactive"), session_doc(name, git_repo, "ledger-coder")
    )
    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    last = status["lastTurn"]
    assert (last["turn"], last["route"], last["outcome"], last["toolsRun"]) == (
        1,
        "reactive",
        "success",
        1,
    )
    assert last["requestedLoop"] == "reactive" and last["phasePath"][-1] == "done"
    table = operator.cp.kubectl("get", "session", name, "-n", operator.namespace)
    header, row = table.stdout.splitlines()[:2]
    assert "OUTCOME" in header.split()
    assert row.split()[header.split().index("OUTCOME")] == "success"


def test_a_runaway_turn_fails_the_session_turn_runaway(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Any
) -> None:
    name = "ledger-runaway"
    calls = [{"name": "bash", "input": {"command": f"echo {i}"}} for i in range(4)]
    scripted_model.load({"conversations": {name: [{"tool_uses": calls}, {"text": "never"}]}})
    spec = agent_doc("runaway-coder", loop="reactive", limits={"maxStepsPerTurn": 2})
    operator.apply(spec, session_doc(name, git_repo, "runaway-coder"))
    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Failed", status
    assert _condition(status, "Failed")["reason"] == "TurnRunaway"
    assert status["lastSettlement"]["error"].startswith("runaway: ")
    assert status["lastTurn"]["errorType"] == "runaway"
    assert status["lastTurn"]["toolsRun"] == 2 and status["lastTurn"]["outcome"] == "partial"


def test_the_api_server_refuses_a_step_cap_over_the_limit(operator: OperatorHandle) -> None:
    refused = operator.cp.kubectl(
        "apply",
        "-n",
        operator.namespace,
        "-f",
        "-",
        input=yaml.safe_dump(agent_doc("too-many", limits={"maxStepsPerTurn": 99999})),
        check=False,
    )
    assert refused.returncode != 0
    assert "maxStepsPerTurn" in refused.stderr and "5000" in refused.stderr
