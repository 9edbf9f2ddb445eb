"""Hooks from YAML alone, on the real API server: the operator admits the Agent's hooks with
each turn and the harness in the sandbox pod runs them (the model is the scripted server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ._operator_fixtures import OperatorHandle, ScriptedModelHandle, agent_doc, session_doc

pytestmark = pytest.mark.timeout(150)

VETO = (
    "if grep -q 'rm -rf'; then "
    'echo \'{"decision": "deny", "reason": "rm -rf is vetoed by the platform", '
    '"continue": true}\'; fi'
)
OPENING = 'cat >/dev/null; echo \'{"additionalContext": "platform rule: never force-push"}\''


def _results(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for message in request["body"]["messages"]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


def test_a_command_hook_from_the_agent_yaml_vetoes_a_call_in_the_sandbox(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-hooked"
    scripted_model.load(
        {
            "conversations": {
                name: [
                    {"tool_use": {"name": "bash", "input": {"command": "rm -rf ."}}},
                    {"tool_use": {"name": "bash", "input": {"command": "ls"}}},
                    {"text": "Left everything in place. The task is done."},
                ]
            }
        }
    )
    hooks = {
        "sessionStart": [{"name": "rules", "command": OPENING}],
        "beforeTool": [{"name": "no-rm-rf", "matcher": ["bash"], "command": VETO}],
    }
    operator.apply(agent_doc(hooks=hooks), session_doc(name, git_repo))

    status = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    first, _, third = scripted_model.requests(name)
    assert "platform rule: never force-push" in str(first["body"].get("system"))
    vetoed, listed = _results(third)
    assert vetoed["is_error"]
    assert "rm -rf is vetoed by the platform" in json.dumps(vetoed["content"])
    assert "README" in json.dumps(listed["content"])  # the checkout is still there
