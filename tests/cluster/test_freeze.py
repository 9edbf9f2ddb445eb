"""A freeze on the real API server: `corral freeze` / `unfreeze` (and the Freeze objects kubectl
sees) hold a namespace mid-turn, an Agent's sessions and one session tree, with the operator as
a subprocess under the chart's RBAC, sandbox pods on the local node and the scripted model; and
the custodian, under the sandbox identity, refuses a model call, a push and a spawn while held.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_dev.controlplane import ControlPlane

from ._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)
from .test_custodian_cluster import (  # noqa: F401  (fixtures)
    Start,
    apply,
    custodian,
    sandbox_token,
    session,
)

pytestmark = pytest.mark.timeout(180)


def corral(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """The user's CLI, as a person with the admin kubeconfig."""
    return subprocess.run(
        [sys.executable, "-m", "corral_cli.main", *args, "--kubeconfig", str(cp.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)


def frozen(op: OperatorHandle, name: str) -> dict[str, Any] | None:
    status = op.session_status(name)
    held = condition(status, "Frozen")
    return status if held is not None and held["status"] == "True" else None


def test_freezing_a_namespace_mid_turn_aborts_holds_and_unfreezing_continues_the_turn(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    ns = operator.namespace
    name, late = f"{ns}-busy", f"{ns}-late"
    scripted_model.load(
        {
            "conversations": {
                # The first model call hangs (long enough for the freeze, short enough that the
                # model server can stop at the end): the turn is in flight when the freeze comes.
                name: [{"text": "never sent", "delay": 30}, {"text": "ALL GREEN: done."}],
                late: [{"text": "Late but done."}],
            }
        }
    )
    # One turn and an evaluation budget of one: the continuation must fit in both.
    operator.apply(
        agent_doc(limits={"maxTurns": 1}),
        session_doc(name, git_repo, evaluation={"criteria": {"substring": "ALL GREEN"},
                                                "turnBudget": 1}),
    )  # fmt: skip
    wait_for("the first model call", lambda: scripted_model.requests(name), timeout=90)
    in_flight = operator.session_status(name)["ledger"]

    done = corral(operator.cp, "freeze", "namespace", "-n", ns, "--reason", "incident 42")
    assert done.returncode == 0, done.stderr
    assert "freeze.corral.dev/namespace created" in done.stdout

    try:
        status = wait_for("the session to be held", lambda: frozen(operator, name), timeout=60)
    except AssertionError as err:
        raise AssertionError(
            f"{err}\nstatus: {operator.session_status(name)}\n{operator.logs()[-6000:]}"
        ) from None
    status = wait_for(
        "the aborted settlement",
        lambda: (s := operator.session_status(name)).get("lastSettlement") and s,
        timeout=30,
    )
    assert status["lastSettlement"]["submissionId"] == in_flight["submissionId"]
    assert status["lastSettlement"]["status"] == "aborted"
    assert "ledger" not in status
    assert status["turns"] == 0 and status["freezeInterruptions"] == 1
    assert status["evaluationTurns"] == 0
    assert status["phase"] == "Running"  # not ended: held
    held = condition(status, "Frozen")
    assert held is not None and held["reason"] == "Frozen"
    assert "incident 42" in held["message"] and "namespace" in held["message"]
    assert "Frozen" in [e["reason"] for e in operator.events(name)]
    wait_for(
        "Progressing to say Frozen",
        lambda: (
            (c := condition(operator.session_status(name), "Progressing"))
            and c["reason"] == "Frozen"
        ),
        timeout=30,
    )
    # kubectl shows it: a printer column on Sessions, and the Freeze itself.
    table = operator.cp.kubectl("get", "sessions", "-n", ns).stdout
    assert "FROZEN" in table.splitlines()[0] and "True" in table, table
    freeze = operator.get("freeze", "namespace")
    assert freeze is not None
    wait_for(
        "the Freeze's Active condition",
        lambda: condition(
            (operator.get("freeze", "namespace") or {}).get("status") or {}, "Active"
        ),
    )

    # Nothing new is admitted: a Session applied now gets no pod and no turn.
    operator.apply(session_doc(late, git_repo))
    wait_for("the new session to be held", lambda: frozen(operator, late), timeout=30)
    time.sleep(3)
    assert operator.get("pod", f"corral-{late}") is None
    assert operator.session_status(late)["phase"] == "Pending"
    assert scripted_model.requests(late) == []
    assert len(scripted_model.requests(name)) == 1

    done = corral(operator.cp, "unfreeze", "namespace", "-n", ns)
    assert done.returncode == 0, done.stderr
    assert operator.get("freeze", "namespace") is None

    status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=90)
    assert status["phase"] == "Succeeded", status
    # The continuation ran under the interrupted turn's number: one turn, one judged turn.
    assert status["turns"] == 1 and status["evaluationTurns"] == 1
    assert status["freezeInterruptions"] == 1
    thawed = condition(status, "Frozen")
    assert thawed is None or thawed["status"] == "False"
    requests = scripted_model.requests(name)
    assert len(requests) == 2
    assert "interrupted by a freeze" in json.dumps(requests[1]["body"]["messages"][-1])
    assert operator.wait_phase(late, {"Succeeded", "Failed"}, timeout=90)["phase"] == "Succeeded"


def test_freezing_an_agent_and_a_session_tree_holds_them_and_nothing_else(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    ns = operator.namespace
    held_agent, tree, child, free = (f"{ns}-{s}" for s in ("a", "tree", "child", "free"))
    scripted_model.load({"conversations": {n: [{"text": "Done."}] for n in (held_agent, free)}})
    operator.apply(agent_doc("coder"), agent_doc("lead", orchestrator=True))
    assert corral(operator.cp, "freeze", "agent", "coder", "-n", ns).returncode == 0
    done = corral(operator.cp, "freeze", "session", tree, "-n", ns, "--reason", "look first")
    assert done.returncode == 0, done.stderr

    operator.apply(
        session_doc(held_agent, git_repo, agent="coder"),
        session_doc(tree, git_repo, agent="lead"),
        session_doc(free, git_repo, agent="lead"),
    )
    parent = operator.get("session", tree)
    assert parent is not None
    ref = {"name": tree, "uid": parent["metadata"]["uid"]}
    operator.apply(session_doc(child, git_repo, agent="lead", parentRef=ref))

    assert operator.wait_phase(free, {"Succeeded", "Failed"})["phase"] == "Succeeded"
    for name in (held_agent, tree, child):
        status = wait_for(f"{name} to be held", lambda n=name: frozen(operator, n), timeout=30)
        assert status["phase"] == "Pending", status
        assert operator.get("pod", f"corral-{name}") is None
    message = condition(operator.session_status(child), "Frozen")["message"]  # type: ignore[index]
    assert f"session {tree}" in message and "ancestor" in message and "look first" in message
    assert "agent coder" in condition(operator.session_status(held_agent), "Frozen")["message"]  # type: ignore[index]
    # `kubectl get freezes` lists both, by scope.
    table = operator.cp.kubectl("get", "freezes", "-n", ns).stdout
    assert f"session-{tree}" in table and "agent-coder" in table

    # Lifting the agent's freeze releases its session only; the tree stays held.
    done = corral(operator.cp, "unfreeze", "agent", "coder", "-n", ns, "--keep")
    assert done.returncode == 0, done.stderr
    assert (operator.get("freeze", "agent-coder") or {})["spec"]["frozen"] is False
    status = operator.wait_phase(held_agent, {"Succeeded", "Failed"})
    assert status["phase"] == "Succeeded", status
    wait_for(  # ended: the condition goes with the hold
        "the Frozen condition to go",
        lambda: condition(operator.session_status(held_agent), "Frozen") is None,
    )
    assert frozen(operator, tree) and frozen(operator, child)
    missing = corral(operator.cp, "unfreeze", "session", "nosuch", "-n", ns)
    assert missing.returncode == 2 and 'freezes "session-nosuch" not found' in missing.stderr


def test_the_custodian_refuses_model_calls_pushes_and_spawns_while_frozen(
    control_plane: ControlPlane,
    namespace: str,
    custodian: Start,  # noqa: F811
    scripted_model: ScriptedModelHandle,
) -> None:
    lead = apply(control_plane, session("lead", namespace))
    me = apply(control_plane, session("leaf", namespace, parent=lead))
    body = {
        "model": "claude-haiku-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "freeze-probe"},
    }
    with custodian(me, CORRAL_UPSTREAM_URL=scripted_model.url) as running:
        before = httpx.post(f"{running.url}/v1/messages", json=body, headers=running.headers)
        assert before.status_code == 200, before.text
        # The parent's tree is frozen: the child is held through its ancestor.
        control_plane.kubectl(
            "apply", "-f", "-",
            input=json.dumps({
                "apiVersion": "corral.dev/v1alpha1", "kind": "Freeze",
                "metadata": {"name": "session-lead", "namespace": namespace},
                "spec": {"scope": {"session": "lead"}, "reason": "hold on"},
            }),
        )  # fmt: skip
        time.sleep(1.2)  # the custodian's cache lives at most a second
        refused = httpx.post(f"{running.url}/v1/messages", json=body, headers=running.headers)
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["type"] == "session_frozen_error"
        assert "session-lead" in error["message"] and "hold on" in error["message"]
        assert refused.headers["x-should-retry"] == "false"
        for tool, args in (("spawn_child", {"task": "more"}), ("push", {})):
            answer = httpx.post(
                f"{running.url}/agents/conv/tools/{tool}", json=args, headers=running.headers
            ).json()
            assert answer["isError"] is True
            assert "session_frozen_error" in answer["content"], answer
        mine = f"corral.dev/parent-uid={me['metadata']['uid']}"
        children = control_plane.kubectl(
            "get", "sessions", "-n", namespace, "-l", mine, "-o", "name"
        ).stdout
        assert children.strip() == ""

        control_plane.kubectl(
            "patch", "freeze", "session-lead", "-n", namespace, "--type=merge",
            "-p", '{"spec": {"frozen": false}}',
        )  # fmt: skip
        time.sleep(1.2)
        after = httpx.post(f"{running.url}/v1/messages", json=body, headers=running.headers)
        assert after.status_code == 200, after.text
