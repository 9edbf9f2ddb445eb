"""Two operators, one leader (ADR 0103): on the real API server, under the chart's RBAC (the
Lease's Role included), with Sessions whose turns are in flight when the leader dies.

The terms are shortened (6 s lease, 4 s renew deadline, 1 s retry) so that a takeover takes
seconds; the chart's are 15/10/2 (a bound of 17 s, docs/operations.md)."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from corral_dev import controlplane

from ._operator_fixtures import (
    OPERATOR_NAMESPACE,
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)

DURATION, RENEW, RETRY = 6.0, 4.0, 1.0


def _replica(operator: OperatorHandle, who: str) -> tuple[OperatorHandle, int]:
    """Another `corral-operator` like the fixture's, on its own health port, electing."""
    health = controlplane.free_port()
    args = list(operator.args)
    at = args.index("--liveness")
    args[at + 1] = f"http://127.0.0.1:{health}/healthz"
    args += [
        f"--leader-elect-lease={OPERATOR_NAMESPACE}/corral-{operator.namespace}-operator",
        f"--leader-elect-identity={who}",
        f"--leader-elect-lease-duration={DURATION}",
        f"--leader-elect-renew-deadline={RENEW}",
        f"--leader-elect-retry-period={RETRY}",
    ]
    log = operator.log.with_name(f"operator-{who}.log")
    return replace(operator, args=args, log=log, process=None), health


def _holder(operator: OperatorHandle) -> str:
    done = operator.cp.kubectl(
        "get", "lease", f"corral-{operator.namespace}-operator", "-n", OPERATOR_NAMESPACE,
        "-o", "json", check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return ""
    return str(json.loads(done.stdout)["spec"].get("holderIdentity") or "")


def _health(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return dict(json.loads(answer.read() or b"{}"))
    except OSError:
        return None


def _reasons(op: OperatorHandle, name: str) -> list[str]:
    return [e["reason"] for e in op.events(name)]


def test_the_standby_takes_over_a_killed_leader_mid_turn_and_nothing_is_admitted_twice(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    operator.stop()  # the fixture's lone operator: two electing ones take its place
    a, a_health = _replica(operator, "replica-a")
    b, b_health = _replica(operator, "replica-b")
    try:
        a.start()
        wait_for("replica-a to lead", lambda: _holder(operator).startswith("replica-a_"), 60)
        b.start()
        # It answers at once; the leader it names, after its first look at the Lease.
        standby = wait_for(
            "replica-b standing by", lambda: (_health(b_health) or {}).get("leader") and (
                _health(b_health)), 60
        )  # fmt: skip
        assert standby["role"] == "standby" and standby["leader"].startswith("replica-a_")

        # Turns in flight when the leader dies: a slow first answer keeps each one open.
        names = [f"{operator.namespace}-lead-{i}" for i in range(3)]
        slow = [{"text": "Finished under the new leader.", "delay": 8}]
        scripted_model.load({"conversations": {name: slow for name in names}})
        operator.apply(agent_doc(), *(session_doc(name, git_repo) for name in names))
        for name in names:
            wait_for(f"{name}'s turn in flight", lambda n=name: a.session_status(n).get("ledger"))
            wait_for(f"{name}'s TurnAdmitted", lambda n=name: "TurnAdmitted" in _reasons(a, n))
        assert (_health(b_health) or {}).get("role") == "standby"  # it drove nothing meanwhile

        a.kill()
        killed = time.monotonic()
        wait_for("replica-b to lead", lambda: _holder(operator).startswith("replica-b_"), 60)
        takeover = time.monotonic() - killed
        # The bound: the lease's duration after its last renewal, plus one try; a second of
        # slack for kubectl's own start.
        assert takeover <= DURATION + RETRY + 3, f"takeover took {takeover:.1f} s"

        for name in names:
            status = b.wait_phase(name, {"Succeeded", "Failed"}, timeout=120)
            assert status["phase"] == "Succeeded", status
            assert status["turns"] == 1
            assert len(scripted_model.requests(name)) == 1, name  # admitted once, answered once
            assert _reasons(b, name).count("TurnAdmitted") == 1, _reasons(b, name)
            assert _reasons(b, name).count("SandboxCreating") == 1, _reasons(b, name)

        # A leader stopped on purpose releases the Lease: its standby leads at its next try,
        # long before the lease would have run out.
        a.start()
        wait_for("replica-a standing by", lambda: (_health(a_health) or {}).get("role"), 60)
        b.stop()
        stopped = time.monotonic()
        wait_for("replica-a to lead again", lambda: _holder(operator).startswith("replica-a_"), 30)
        assert time.monotonic() - stopped < DURATION, "a released lease is taken at once"
        later = f"{operator.namespace}-lead-after"
        scripted_model.load({"conversations": {later: [{"text": "Done."}]}})
        operator.apply(session_doc(later, git_repo))
        assert a.wait_phase(later, {"Succeeded", "Failed"})["phase"] == "Succeeded"
        assert "leads after" in a.logs() and "released lease" in b.logs()
    finally:
        a.stop()
        b.stop()
