"""A drain waits for the turn in flight (docs/operations.md, "Drains"): under the default
`whenIdle` policy the operator holds a PodDisruptionBudget for the Session's sandbox pod while
its turn runs, so the API server refuses the pod's eviction (429, what `kubectl drain` retries)
until the turn settles or has run `maxWaitSeconds`; under `allow` there is never a budget. On
the real API server with kube-controller-manager's disruption controller, the local node and
the scripted model, the operator under the chart's RBAC."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ._operator_fixtures import (
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)

DELAY = 10  # seconds each turn's model call is held: the turn is in flight meanwhile
MAX_WAIT = 2  # the third Session's maxWaitSeconds: its budget goes while its turn still runs


def _evict(op: OperatorHandle, pod: str) -> subprocess.CompletedProcess[str]:
    """POST the pod's `eviction` subresource, as `kubectl drain` does for each pod."""
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": op.namespace},
    }
    path = f"/api/v1/namespaces/{op.namespace}/pods/{pod}/eviction"
    return op.cp.kubectl(
        "create", "--raw", path, "-f", "-", input=json.dumps(eviction), check=False
    )


def _in_flight(op: OperatorHandle, name: str) -> dict[str, Any] | None:
    status = op.session_status(name)
    return status if status.get("ledger") else None


def test_an_eviction_waits_for_the_turn_in_flight_and_allow_never_holds_one(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    ns = operator.namespace
    held, loose, brief = f"{ns}-held", f"{ns}-loose", f"{ns}-brief"
    scripted_model.load(
        {
            "conversations": {
                name: [{"text": "Done.", "delay": DELAY}] for name in (held, loose, brief)
            }
        }
    )
    operator.apply(
        agent_doc("coder"),  # the default: whenIdle
        agent_doc("loose", sandbox={"disruption": {"policy": "allow"}}),
        agent_doc("brief", sandbox={"disruption": {"maxWaitSeconds": MAX_WAIT}}),
        session_doc(held, git_repo, "coder", keepSandbox=True),
        session_doc(loose, git_repo, "loose", keepSandbox=True),
        session_doc(brief, git_repo, "brief"),
    )
    pod = f"corral-{held}"

    # Turn 1 in flight: the budget holds exactly the sandbox pod.
    status = wait_for("the turn in flight", lambda: _in_flight(operator, held), 60)
    budget = wait_for("the budget", lambda: operator.get("poddisruptionbudget", pod), 10)
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == {
        "corral.dev/session": held,
        "app.kubernetes.io/component": "sandbox",
    }
    assert budget["metadata"]["annotations"]["corral.dev/turn"] == str(status["ledger"]["turn"])
    sandbox = operator.get("pod", pod)
    assert sandbox is not None
    [owner] = budget["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", pod, sandbox["metadata"]["uid"])

    # Once the disruption controller has counted the pod, its eviction is refused.
    def computed() -> dict[str, Any] | None:
        found = operator.get("poddisruptionbudget", pod) or {}
        observed = (found.get("status") or {}).get("observedGeneration")
        return found if observed == found["metadata"]["generation"] else None

    computed_budget = wait_for("the budget's status", computed, 10)
    assert computed_budget["status"]["disruptionsAllowed"] == 0
    refused = _evict(operator, pod)
    assert refused.returncode != 0, refused.stdout
    assert "TooManyRequests" in refused.stderr and "disruption budget" in refused.stderr, (
        refused.stderr
    )
    assert _in_flight(operator, held) is not None  # refused while the turn still ran
    assert operator.get("pod", pod) is not None

    # allow: the other Session's turn runs as long, with no budget at any point.
    wait_for("the allow Session's turn", lambda: _in_flight(operator, loose), 30)
    assert operator.get("poddisruptionbudget", f"corral-{loose}") is None

    # maxWaitSeconds: a turn holds off a drain that long at most, even still in flight.
    wait_for("the short wait's turn", lambda: _in_flight(operator, brief), 30)
    wait_for(
        "the short wait's budget to be lifted",
        lambda: f"{brief}: turn 1 held off a drain for {MAX_WAIT} s" in operator.logs(),
        MAX_WAIT + 5,
    )
    assert operator.get("poddisruptionbudget", f"corral-{brief}") is None
    logs = operator.logs()  # lifted before the turn settled (if it has by now)
    settled = logs.find(f"turn 1 settled completed [run {brief}.1]")
    assert settled == -1 or logs.index(f"{brief}: turn 1 held off a drain") < settled, logs

    # The turn settles: the budget goes with it and the pod may be evicted.
    status = operator.wait_phase(held, {"Succeeded", "Failed"}, timeout=60)
    assert status["phase"] == "Succeeded", status
    wait_for("the budget to go", lambda: operator.get("poddisruptionbudget", pod) is None, 10)
    accepted = _evict(operator, pod)
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["status"] == "Success"
    wait_for("the evicted pod to go", lambda: operator.get("pod", pod) is None, 30)

    for other in (loose, brief):
        assert operator.wait_phase(other, {"Succeeded", "Failed"})["phase"] == "Succeeded"
    assert operator.get("poddisruptionbudget", f"corral-{loose}") is None
