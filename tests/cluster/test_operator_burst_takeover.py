"""The leading operator SIGKILLed in the middle of a burst of 100 Sessions (ADR 0103).

Two electing `corral-operator` replicas under the chart's RBAC (the Lease's Role included),
with the short terms of test_operator_leader.py (6 s lease, 4 s renew deadline, 1 s retry).
The sandbox side is the STAND-IN SANDBOX (`corral_dev._standin_sandbox`): one process that
binds every sandbox pod of the namespace to its own Node, marks it Ready and answers its wire,
with turns of TURN_SECONDS, and keeps a record of every admission its wire answered
(`--record`): the sandbox's own account, whoever asked. As the harness does, it answers an
admission that repeats a conversation's idempotency key with the submission the key was first
given, and admits nothing; the record marks such an answer as a repeat.

100 Sessions are applied at once, as a person would (`kubectl apply -f` of one multi-document
file). Once the leader has admitted at least KILL_AFTER of them (status.startedAt) and not all,
it gets SIGKILL: its turns are in flight, and more of its admissions are answered on the wire
than written to their Sessions' status (the ledger write follows the admission, and lags it by
seconds in a burst), so its successor asks again for those, with the same idempotency key.
Asserted: the standby holds the Lease within the bound; every Session Succeeded after one turn;
the stand-in's record holds exactly one admission per Session (turn 1, no idempotency key
admitted twice; a repeated key is answered with the first submission), and it is the
submission the Session's status says settled (the two ledgers agree); turns admitted before the
kill were still in flight at the takeover. The takeover (kill -> the standby holds the Lease),
kill -> every Session Succeeded and the burst end to end (apply -> every Session Succeeded)
are printed and kept in the tier's summary.

The local node binds every pod it sees without a node, in any namespace, and an earlier test of
this worker may have started it (it lives as long as the tier): a ValidatingAdmissionPolicy
lets this namespace's pods be bound to the stand-in's Node only, so the stand-in alone answers
them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral_dev import controlplane, stack
from corral_dev._standin_sandbox import NODE_NAME as STANDIN_NODE
from corral_dev.controlplane import ControlPlane

from ..conftest import record_tier_time
from ._operator_fixtures import OPERATOR_NAMESPACE, OperatorHandle, agent_doc, wait_for

pytestmark = pytest.mark.timeout(420)

SESSIONS = 100
KILL_AFTER = 30  # Sessions admitted by the leader before the kill
TURN_SECONDS = 15.0  # long enough that the turns admitted before the kill outlive the takeover
DURATION, RENEW, RETRY = 6.0, 4.0, 1.0
# ADR 0103's bound after a leader dies without releasing, from its last renewal (before the
# kill): the lease's duration and two tries; and two seconds of slack for a loaded machine
# (the tier's other workers) and this process's Lease reads.
TAKEOVER_BOUND_S = DURATION + 2 * RETRY + 2.0
ALL_SUCCEEDED_TIMEOUT_S = 240.0
FINISHED = ("Succeeded", "Failed", "Stopped")


# ------------------------------------------------------------------------ the stand-in


@pytest.fixture
def standin_only(control_plane: ControlPlane, namespace: str) -> Iterator[None]:
    """A ValidatingAdmissionPolicy that refuses to bind a pod of `namespace` to any Node but
    the stand-in's: the local node, if this worker runs one, tries and is refused."""
    name = f"corral-standin-only-{namespace}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods/binding"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": f"object.target.name == '{STANDIN_NODE}'",
                    "message": f"the pods of {namespace} are the stand-in sandbox's",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    stack.apply_docs(control_plane, [policy, binding])
    try:
        yield
    finally:
        api = "/apis/admissionregistration.k8s.io/v1"
        control_plane.api_send("DELETE", f"{api}/validatingadmissionpolicybindings/{name}")
        control_plane.api_send("DELETE", f"{api}/validatingadmissionpolicies/{name}")


@dataclass
class Standin:
    """The stand-in sandbox's process and its record of admissions."""

    process: subprocess.Popen[bytes]
    record: Path
    log: Path

    def record_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]


@pytest.fixture
def standin(
    control_plane: ControlPlane, namespace: str, standin_only: None, tmp_path: Path
) -> Iterator[Standin]:
    record, log = tmp_path / "standin-admissions.jsonl", tmp_path / "standin.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "corral_dev._standin_sandbox",
         "--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace,
         "--turn-seconds", str(TURN_SECONDS), "--record", str(record)],
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
    )  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"ready", log.read_text(errors="replace")
        yield Standin(process, record, log)
    finally:
        # Its pods go before it does: a pod bound to a Node that no kubelet serves stays
        # Terminating, and so would the namespace. The operators have released them by now;
        # what a failed test left is removed at once.
        control_plane.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force",
            "--wait=false", check=False,
        )  # fmt: skip
        process.terminate()
        process.wait(timeout=30)
        control_plane.api_send("DELETE", f"/api/v1/nodes/{STANDIN_NODE}")


# ------------------------------------------------------------------------ the operators


def _replica(
    plane: ControlPlane, namespace: str, who: str, tmp_path: Path
) -> tuple[OperatorHandle, int]:
    """One electing `corral-operator`, as the chart runs it, with the short terms."""
    kubeconfig = stack.identity_kubeconfig(plane, OPERATOR_NAMESPACE, stack.OPERATOR_SA)
    health = controlplane.free_port()
    args = stack.operator_args(
        plane,
        kubeconfig=kubeconfig,
        namespaces=[namespace],
        health_port=health,
        model_url="http://127.0.0.1:9",  # never called: the stand-in runs no model
    )
    args += [
        f"--leader-elect-lease={OPERATOR_NAMESPACE}/{_lease(namespace)}",
        f"--leader-elect-identity={who}",
        f"--leader-elect-lease-duration={DURATION}",
        f"--leader-elect-renew-deadline={RENEW}",
        f"--leader-elect-retry-period={RETRY}",
    ]
    log = tmp_path / f"operator-{who}.log"
    return OperatorHandle(plane, namespace, kubeconfig, args, log), health


def _lease(namespace: str) -> str:
    return f"corral-{namespace}-operator"  # the chart's `<release>-operator`


def _holder(plane: ControlPlane, namespace: str) -> str:
    lease = plane.get_object("lease", _lease(namespace), OPERATOR_NAMESPACE) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def _role(health: int) -> str | None:
    """What the replica's /healthz says: `standby`, or `leader` once kopf serves it (kopf's
    probe names no role); None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=2) as answer:
            return str(json.loads(answer.read() or b"{}").get("role") or "leader")
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------- the burst


def _sessions(plane: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    """Every Session's status, by name."""
    return {
        s["metadata"]["name"]: s.get("status") or {}
        for s in plane.list_objects("sessions", namespace)
    }


def _burst_file(namespace: str, path: Path) -> list[str]:
    names = [f"burst-{i:03d}" for i in range(SESSIONS)]
    path.write_text(
        yaml.safe_dump_all(
            {
                "apiVersion": "corral.dev/v1alpha1",
                "kind": "Session",
                "metadata": {"name": name, "namespace": namespace},
                # The stand-in checks nothing out: the repository is never read.
                "spec": {"agentRef": "coder", "task": "Say done.", "workspace": {"repo": "/none"}},
            }
            for name in names
        )
    )
    return names


def _logs(*paths: Path) -> str:
    return "\n".join(f"--- {p.name} (tail)\n{p.read_text(errors='replace')[-3000:]}" for p in paths)


def test_a_leader_killed_mid_burst_hands_over_100_sessions_each_admitted_once(
    control_plane: ControlPlane, namespace: str, standin: Standin, tmp_path: Path
) -> None:
    plane = control_plane
    stack.install_rbac(plane, f"corral-{namespace}", namespace)
    a, a_health = _replica(plane, namespace, "replica-a", tmp_path)
    b, b_health = _replica(plane, namespace, "replica-b", tmp_path)
    logs = (a.log, b.log, standin.log)
    try:
        a.start()
        wait_for("replica-a to serve as the leader", lambda: _role(a_health) == "leader", 60)
        assert _holder(plane, namespace).startswith("replica-a_")
        b.start()
        wait_for("replica-b standing by", lambda: _role(b_health) == "standby", 60)
        a.apply(agent_doc())

        burst = tmp_path / "burst.yaml"
        names = _burst_file(namespace, burst)
        with ThreadPoolExecutor(max_workers=1) as background:
            applied = time.monotonic()
            apply = background.submit(plane.kubectl, "apply", "-f", str(burst), timeout=300)

            def admitted_enough() -> int:
                started = sum(1 for s in _sessions(plane, namespace).values() if s.get("startedAt"))
                return started if started >= KILL_AFTER else 0

            admitted_at_kill = wait_for(f"{KILL_AFTER} Sessions admitted", admitted_enough, 120)
            a.kill()
            killed, killed_wall = time.monotonic(), time.time()
            on_the_wire_at_kill = sum(not line["repeat"] for line in standin.record_lines())
            assert admitted_at_kill < SESSIONS, "the kill did not land mid-burst"

            def b_leads() -> bool:
                return _holder(plane, namespace).startswith("replica-b_")

            wait_for("replica-b to lead", b_leads, 60)
            takeover = time.monotonic() - killed
            takeover_wall = time.time()
            apply.result()  # the burst's whole file was accepted

        def all_finished() -> dict[str, dict[str, Any]] | None:
            statuses = _sessions(plane, namespace)
            finished = [n for n in names if statuses.get(n, {}).get("phase") in FINISHED]
            return statuses if len(finished) == SESSIONS else None

        try:
            statuses = wait_for("every Session finished", all_finished, ALL_SUCCEEDED_TIMEOUT_S)
        except AssertionError as timeout:
            statuses = _sessions(plane, namespace)
            phases = Counter(str(statuses.get(n, {}).get("phase")) for n in names)
            raise AssertionError(f"{timeout}: phases {dict(phases)}\n{_logs(*logs)}") from None
        done = time.monotonic()
        to_all_succeeded, end_to_end = done - killed, done - applied

        print(
            f"burst takeover: {admitted_at_kill} of {SESSIONS} admitted at the SIGKILL "
            f"({on_the_wire_at_kill} on the stand-in's wire), kill -> standby leads "
            f"{takeover:.1f}s, kill -> all Succeeded {to_all_succeeded:.1f}s, burst "
            f"(apply -> all Succeeded) {end_to_end:.1f}s"
        )
        record_tier_time("cluster", "burst takeover: kill -> standby leads", takeover)
        record_tier_time("cluster", "burst takeover: kill -> 100 Succeeded", to_all_succeeded)
        record_tier_time("cluster", "burst takeover: apply -> 100 Succeeded", end_to_end)

        assert takeover <= TAKEOVER_BOUND_S, f"takeover took {takeover:.1f}s\n{_logs(*logs)}"
        unsucceeded = {
            n: (statuses[n].get("phase"), statuses[n].get("turns"), statuses[n].get("message"))
            for n in names
            if statuses[n].get("phase") != "Succeeded" or statuses[n].get("turns") != 1
        }
        assert not unsucceeded, f"not Succeeded after one turn: {unsucceeded}\n{_logs(*logs)}"

        # The stand-in's record against the Sessions' own account (status.lastSettlement).
        record = standin.record_lines()
        admissions = [line for line in record if not line["repeat"]]
        keys = Counter((line["conversation"], line["key"]) for line in admissions)
        assert [k for k, n in keys.items() if n > 1] == [], "an idempotency key admitted twice"
        per_session = Counter(line["conversation"] for line in admissions)
        assert {n: per_session[n] for n in names if per_session[n] != 1} == {}, admissions
        assert set(per_session) == set(names), admissions
        submission = {line["conversation"]: line["submission"] for line in admissions}
        for line in admissions:
            name = line["conversation"]
            assert (line["turn"], line["key"]) == (1, "turn-1"), line
            settled = statuses[name].get("lastSettlement") or {}
            assert settled.get("submissionId") == line["submission"], (line, settled)
            assert settled.get("status") == "completed", (line, settled)
        repeats = [line for line in record if line["repeat"]]
        assert all(line["submission"] == submission[line["conversation"]] for line in repeats)

        # Turns in flight across the takeover: admitted by the killed leader, and still
        # running (TURN_SECONDS) when its successor took the Lease, which re-attached to them.
        # (The wire may be ahead of the statuses: all 100 admitted there at the kill is not
        # a failure, as long as not all were in their Sessions' status.)
        before = [line for line in admissions if line["t"] < killed_wall]
        in_flight = [line for line in before if line["t"] + TURN_SECONDS > takeover_wall]
        assert in_flight, f"no turn in flight at the takeover: {len(before)} admitted before"
        print(
            f"burst takeover: {len(before)} admitted on the stand-in's wire before the kill, "
            f"{len(in_flight)} of them still in flight at the takeover; "
            f"{SESSIONS - len(before)} admitted by the successor; "
            f"{sum(1 for line in repeats if line['t'] >= killed_wall)} asked again with the "
            f"same key by the successor, {sum(1 for line in repeats if line['t'] < killed_wall)} "
            "by the killed leader"
        )

        # The Sessions release their pods; the stand-in removes each as its kubelet would.
        wait_for("the sandbox pods released", lambda: not plane.list_objects("pods", namespace), 60)
    finally:
        a.stop()
        b.stop()
