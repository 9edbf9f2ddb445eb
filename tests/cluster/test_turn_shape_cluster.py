"""The turn's shape on the real API server (docs/turns.md): a turn that asks a question leaves
the Session WaitingForHuman with the question in status; `corral reply` appends to
spec.replies and the next turn starts from it. A forced plan's verdicts land in status. The API
server refuses the retired `loop: plan`, a check without a test, and a reply taken back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ._operator_fixtures import OperatorHandle, ScriptedModelHandle, agent_doc, session_doc

pytestmark = pytest.mark.timeout(180)


def corral(op: OperatorHandle, *args: str) -> subprocess.CompletedProcess[str]:
    """The user's CLI, as a person with the admin kubeconfig."""
    return subprocess.run(
        [sys.executable, "-m", "corral_cli.main", *args, "--kubeconfig", str(op.cp.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _classify(**fields: Any) -> dict[str, Any]:
    return {"classify": {"understood": "fix a file", "done": "the file is fixed", **fields}}


def test_a_question_waits_for_corral_reply_and_the_next_turn_starts_from_it(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-ask"
    scripted_model.load(
        {
            "conversations": {
                name: [
                    _classify(clear=False, question="Which file should I fix?"),
                    {
                        **_classify(clear=True, route="direct"),
                        "when": {"last_user_contains": "b.txt"},
                    },
                    "I fixed b.txt.",
                ]
            }
        }
    )
    agent = agent_doc("asker", scheduler={"classifierModel": "corral-scripted"})
    operator.apply(agent, session_doc(name, git_repo, agent="asker", task="Fix the file."))

    waiting = operator.wait_phase(name, {"WaitingForHuman", "Succeeded", "Failed"})
    assert waiting["phase"] == "WaitingForHuman", waiting
    assert waiting["question"] == "Which file should I fix?"
    assert waiting["lastTurn"]["outcome"] == "handed_to_human"
    assert waiting["lastTurn"]["phasePath"] == ["understand", "ask", "wait_for_human", "stopped"]
    described = operator.cp.kubectl("describe", "session", name, "-n", operator.namespace).stdout
    assert "Which file should I fix?" in described

    replied = corral(operator, "reply", name, "b.txt,", "please", "-n", operator.namespace)
    assert replied.returncode == 0, replied.stderr
    done = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert done["phase"] == "Succeeded", done
    assert done["answer"] == "I fixed b.txt."
    assert done["repliesRead"] == 1 and done.get("question") is None
    session = operator.get("session", name)
    assert session is not None and session["spec"]["replies"] == ["b.txt, please"]
    # The classifier of the second turn read the reply.
    second = scripted_model.requests(name)[1]["body"]
    assert "b.txt, please" in str(second["messages"])

    late = corral(operator, "reply", name, "too late", "-n", operator.namespace)
    assert late.returncode == 1 and "not waiting for a reply" in late.stderr
    # A reply cannot be taken back: the API server keeps spec.replies append-only.
    patch = operator.cp.kubectl(
        "patch", "session", name, "-n", operator.namespace, "--type=merge",
        "-p", '{"spec": {"replies": []}}', check=False,
    )  # fmt: skip
    assert patch.returncode != 0 and "replies can only be appended" in patch.stderr


OK_TOKEN = {"token": "OK"}


def test_a_forced_plan_leaves_its_verdicts_in_status(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-plan"
    scripted_model.load(
        {
            "conversations": {
                name: [
                    {"tool_use": {"name": "bash", "input": {"command": "echo NOPE"}}},
                    "done, it says OK",
                    {"plan_edit": {"step": 1, "action": "say OK, really", "check": OK_TOKEN}},
                    {"tool_use": {"name": "bash", "input": {"command": "echo OK"}}},
                    "done",
                ]
            }
        }
    )
    plan = {"steps": [{"action": "say OK", "check": {"token": "OK"}}]}
    operator.apply(agent_doc("planner"), session_doc(name, git_repo, agent="planner", plan=plan))
    done = operator.wait_phase(name, {"Succeeded", "Failed"})
    assert done["phase"] == "Succeeded", done
    assert done["plan"]["state"] == "Done"
    (step,) = done["plan"]["steps"]
    assert (step["action"], step["verdict"], step["attempts"]) == ("say OK, really", "Held", 2)
    assert done["lastTurn"]["handler"] == "forced_plan"


def test_the_api_server_refuses_a_retired_loop_and_a_check_without_a_test(
    operator: OperatorHandle, git_repo: Path
) -> None:
    import yaml

    def refused(doc: dict[str, Any]) -> str:
        doc["metadata"]["namespace"] = operator.namespace
        out = operator.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)
        assert out.returncode != 0, out.stdout
        return out.stderr

    assert "a forced plan is Session.spec.plan" in refused(agent_doc("old", loop="plan"))
    empty_check = {"steps": [{"action": "x", "check": {}}]}
    assert "a check needs at least one test" in refused(
        session_doc("nocheck", git_repo, plan=empty_check)
    )
