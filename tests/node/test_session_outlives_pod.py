"""A Session outlives its pod on the real node (issue 27; docs/turns.md, "A lost pod", and
docs/operations.md, "Drains"): the chart installed with an archive (a hostPath volume stands in
for a provisioned claim), a sandbox pod deleted mid-turn, and a `kubectl drain` of the node
while a turn runs. Each Session ends Succeeded with no turn run twice and its work on its
branch, in real containers under the real kubelet."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..conftest import record_tier_time
from . import _corral
from ._corral import Corral
from ._target import Target

pytestmark = pytest.mark.timeout(420)

DELAY = 20  # seconds a held model answer waits: the pod goes (or the drain waits) meanwhile


@pytest.fixture(scope="module")
def corral(target: Target) -> Iterator[Corral]:
    if target.name == "external":
        pytest.skip("the archive's volume is made for the local node only")
    start = time.monotonic()
    with _corral.installed(target) as installed:
        took = time.monotonic() - start
        record_tier_time("node", "Corral installed with an archive (helm)", took)
        yield installed


def _branch_files(corral: Corral, branch: str) -> set[str]:
    remote = corral.work / "repos" / "work" / "repo"
    listed = subprocess.run(
        ["git", "-C", str(remote), "ls-tree", "--name-only", branch],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return set(listed.stdout.split())


def _archived_admission(corral: Corral, name: str, submission: str) -> list[Path]:
    runs = corral.work / "archive" / corral.namespace / name
    return [c for c in runs.glob(".conversation-*/*.ndjson") if submission in c.read_text()]


def _in_flight(corral: Corral, name: str, turn: int) -> dict[str, Any] | None:
    status = (corral.get("session", name) or {}).get("status") or {}
    ledger = status.get("ledger")
    return ledger if ledger and ledger.get("turn") == turn else None


def _texts(request: dict[str, Any]) -> str:
    return str(request["body"]["messages"])


def test_a_pod_deleted_mid_turn_resumes_in_a_new_pod_and_succeeds(corral: Corral) -> None:
    name = "deleted-mid-turn"
    corral.load_script({"conversations": {name: [
        {"tool_use": {"name": "bash", "input": {"command": "echo one > ONE.md"}}},
        {"text": "Wrote ONE.md."},  # turn 1 ends: delivered; the guard wants more
        {"text": "never seen: the pod goes first", "delay": DELAY},  # turn 2, in flight
        {"tool_use": {"name": "bash", "input": {"command": "cat ONE.md && echo two > TWO.md"}}},
        {"text": "ALL DONE: ONE.md and TWO.md."},
    ]}})  # fmt: skip
    guard = {"criteria": {"substring": "ALL DONE"}, "turnBudget": 4}
    session = _corral.session_doc(name, corral.git_url, evaluation=guard, keepSandbox=False)
    corral.apply(_corral.agent_doc(), session)

    ledger = _corral.wait_for("turn 2 in flight", lambda: _in_flight(corral, name, 2), 240,
                              lambda: corral.diagnose(name))  # fmt: skip
    submission = ledger["submissionId"]
    _corral.wait_for("turn 2's admission archived",
                     lambda: _archived_admission(corral, name, submission), 30)  # fmt: skip
    old = corral.get("pod", f"corral-{name}")
    assert old is not None
    corral.kubectl("delete", "pod", f"corral-{name}", "-n", corral.namespace, "--wait=false")
    deleted = time.monotonic()

    status = corral.wait_phase(name, {"Succeeded", "Failed"}, timeout=300)
    assert status["phase"] == "Succeeded", corral.diagnose(name)
    assert (status["restarts"], status["resumeInterruptions"], status["turns"]) == (1, 1, 2)
    requests = corral.model_requests(name)
    assert len(requests) == 5, [_texts(r)[-200:] for r in requests]  # no turn ran twice
    assert "sandbox pod it ran in was lost" in _texts(requests[3])
    assert "one" in str(requests[4]["body"]["messages"][-1])  # ONE.md came back with the branch
    assert {"ONE.md", "TWO.md"} <= _branch_files(corral, f"corral/{name}")
    # The held model call of the lost pod: let it end at the model before the next test.
    time.sleep(max(0.0, DELAY + 1 - (time.monotonic() - deleted)))


def _node(corral: Corral) -> str:
    return corral.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").stdout


def _drain(corral: Corral, node: str) -> subprocess.Popen[str]:
    """`kubectl drain` of the sandboxes' pods, as the issue's operator would run it."""
    target = corral.target
    return subprocess.Popen(
        [str(target.bin_dir / "kubectl"), "--kubeconfig", str(target.kubeconfig), "drain", node,
         "--pod-selector=corral.dev/session", "--ignore-daemonsets", "--delete-emptydir-data",
         "--timeout=180s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_a_drain_waits_for_the_turn_in_flight_and_the_session_resumes_after_uncordon(
    corral: Corral,
) -> None:
    """whenIdle (the default): the drain's evictions are refused while turn 1 runs; once it
    settles (the Session then waits for its wake, its pod idle) the pod is evicted, the Session
    resumes in a new pod that waits for the node, and after `uncordon` it Succeeds."""
    name = "drained"
    corral.load_script({"conversations": {name: [
        {"tool_use": {"name": "bash", "input": {"command": "echo one > ONE.md"}},
         "delay": DELAY},  # turn 1 in flight while the drain starts
        {"text": "Wrote ONE.md."},
        {"tool_use": {"name": "bash", "input": {"command": "cat ONE.md && echo two > TWO.md"}}},
        {"text": "Woken, and done."},
    ]}})  # fmt: skip
    wake = {"afterSeconds": 20, "message": "Woken: finish with TWO.md."}
    session = _corral.session_doc(name, corral.git_url, wake=wake, keepSandbox=False)
    corral.apply(_corral.agent_doc(), session)
    _corral.wait_for("turn 1 in flight", lambda: _in_flight(corral, name, 1), 240,
                     lambda: corral.diagnose(name))  # fmt: skip
    _corral.wait_for("the turn's disruption budget",
                     lambda: corral.get("pdb", f"corral-{name}"), 30)  # fmt: skip
    pod = corral.get("pod", f"corral-{name}")
    assert pod is not None
    node = _node(corral)
    drain = _drain(corral, node)
    try:
        # The drain waits: while turn 1 runs, its pod is neither evicted nor being deleted.
        while _in_flight(corral, name, 1):
            assert drain.poll() is None, drain.communicate()[0]
            now = corral.get("pod", f"corral-{name}") or {}
            assert now.get("metadata", {}).get("uid") == pod["metadata"]["uid"]
            assert not now["metadata"].get("deletionTimestamp")
            time.sleep(1)
        settled = time.monotonic()
        out, _ = drain.communicate(timeout=120)
        assert drain.returncode == 0, out
        assert f"pod/corral-{name} evicted" in out, out
        waited = time.monotonic() - settled
        # The Session resumes in a new pod, which waits for a schedulable node.
        status = _corral.wait_for(
            "the Session resumed",
            lambda: ((corral.get("session", name) or {}).get("status") or {}).get("restarts"),
            60,
        )
        assert status == 1
    finally:
        corral.kubectl("uncordon", node, check=False)
        if drain.poll() is None:
            drain.kill()
    status = corral.wait_phase(name, {"Succeeded", "Failed"}, timeout=240)
    assert status["phase"] == "Succeeded", corral.diagnose(name)
    # Turn 1 finished before its pod went: nothing was interrupted, nothing ran twice.
    assert (status["turns"], status["restarts"], status.get("resumeInterruptions", 0)) == (2, 1, 0)
    assert len(corral.model_requests(name)) == 4
    assert "one" in str(corral.model_requests(name)[3]["body"]["messages"][-1])
    assert {"ONE.md", "TWO.md"} <= _branch_files(corral, f"corral/{name}")
    resumed = next(c for c in status["conditions"] if c["type"] == "Resumed")
    assert resumed["reason"] == "PodDeleted", resumed
    print(f"the drain finished {waited:.1f}s after the turn settled")


def _billed(tokens: int) -> dict[str, int]:
    """A reply's usage as the provider would bill it: `tokens` in all, most of them input."""
    return {"input_tokens": tokens - 10, "output_tokens": 10}


def test_a_budget_spent_across_two_pods_is_refused_at_its_cap(corral: Corral) -> None:
    """80% of the budget spent in the first pod, the pod deleted mid-turn: the new pod's
    custodian starts from the Session's recorded usage, so the resumed turn is refused once
    the two pods together reach the cap (a custodian starting from zero would let it run)."""
    name = "budget-across-pods"
    corral.load_script({"conversations": {name: [
        {"tool_use": {"name": "bash", "input": {"command": "echo one > ONE.md"}},
         "usage": _billed(4000)},
        {"text": "Wrote ONE.md.", "usage": _billed(4000)},  # 80%: the guard wants more
        {"text": "never seen: the pod goes first", "delay": DELAY, "usage": _billed(20)},
        {"tool_use": {"name": "bash", "input": {"command": "echo two > TWO.md"}},
         "usage": _billed(3000)},  # the resumed turn: 110% after it
        {"text": "ALL DONE, never reached.", "usage": _billed(10)},
    ]}})  # fmt: skip
    guard = {"criteria": {"substring": "ALL DONE"}, "turnBudget": 4}
    session = _corral.session_doc(name, corral.git_url, evaluation=guard, keepSandbox=False,
                                  budget={"tokens": 10_000})  # fmt: skip
    # A small max_tokens: the custodian holds input + max_tokens of the budget per request.
    agent = _corral.agent_doc(limits={"maxOutputTokens": 100})
    agent["metadata"]["name"] = session["spec"]["agentRef"] = "frugal"
    corral.apply(agent, session)
    ledger = _corral.wait_for("turn 2 in flight", lambda: _in_flight(corral, name, 2), 240,
                              lambda: corral.diagnose(name))  # fmt: skip
    submission = ledger["submissionId"]
    _corral.wait_for("turn 2's admission archived",
                     lambda: _archived_admission(corral, name, submission), 30)  # fmt: skip
    corral.kubectl("delete", "pod", f"corral-{name}", "-n", corral.namespace, "--wait=false")
    deleted = time.monotonic()

    status = corral.wait_phase(name, {"Succeeded", "Failed"}, timeout=300)
    assert status["phase"] == "Failed", corral.diagnose(name)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BudgetExceeded", failed
    assert status["restarts"] == 1
    usage = status["usage"]
    assert 10_000 <= usage["inputTokens"] + usage["outputTokens"] <= 12_000, usage
    # Two requests in the first pod, the lost one, one in the second: then the cap.
    assert len(corral.model_requests(name)) == 4
    time.sleep(max(0.0, DELAY + 1 - (time.monotonic() - deleted)))


# A turn's command that holds until the test says GO, a mark in the workspace while it runs (a
# model answer's delay would end on the model's clock, not the test's).
HOLD = "touch RUNNING && until [ -e GO ]; do sleep 0.2; done && rm RUNNING GO && echo one > ONE.md"


def _running(corral: Corral, pod: str) -> str:
    """Where the held command left its mark while it runs ("": it does not run)."""
    found = corral.exec(pod, "tools", "find", "/workspace", "-maxdepth", "2", "-name", "RUNNING")
    return found.stdout.strip() if found.returncode == 0 else ""


def _go(corral: Corral, pod: str) -> None:
    """Let the held command finish (it waits for GO beside its mark)."""
    mark = _running(corral, pod)
    assert mark, f"{pod}: no command holds"
    done = corral.exec(pod, "tools", "touch", mark.removesuffix("RUNNING") + "GO")
    assert done.returncode == 0, done.stderr


def _held(corral: Corral, name: str) -> bool:
    """Turn 1 is in flight and its command holds in the pod's workspace."""
    return bool(_in_flight(corral, name, 1)) and bool(_running(corral, f"corral-{name}"))


def _operator_deployment() -> str:
    return f"deployment/{_corral.RELEASE}-operator"


def _leader(corral: Corral) -> str:
    """The operator pod that holds the Lease (its holderIdentity is `<pod>_<suffix>`)."""
    lease = corral.get("lease", f"{_corral.RELEASE}-operator", _corral.OPERATOR_NAMESPACE) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "").rpartition("_")[0]


def test_suspended_after_its_turn_across_an_operator_restart_it_resumes_and_succeeds(
    corral: Corral,
) -> None:
    """`spec.suspend: true` while turn 1 runs: the turn finishes and is delivered, the pod goes;
    both operator replicas are replaced (`kubectl rollout restart`) while the Session is parked;
    `suspend: false` brings a new pod back at the same point and the Session Succeeds."""
    name = "suspended-restarted"
    corral.load_script({"conversations": {name: [
        {"tool_use": {"name": "bash", "input": {"command": HOLD, "timeout": 300}}},
        {"text": "Wrote ONE.md."},  # turn 1 ends: delivered; the guard wants another turn
        {"tool_use": {"name": "bash", "input": {"command": "cat ONE.md && echo two > TWO.md"}}},
        {"text": "ALL DONE: ONE.md and TWO.md."},
    ]}})  # fmt: skip
    guard = {"criteria": {"substring": "ALL DONE"}, "turnBudget": 4}
    corral.apply(_corral.agent_doc(), _corral.session_doc(name, corral.git_url, evaluation=guard))
    pod = f"corral-{name}"
    _corral.wait_for("turn 1 holding", lambda: _held(corral, name), 240,
                     lambda: corral.diagnose(name))  # fmt: skip
    corral.kubectl("patch", "session", name, "-n", corral.namespace, "--type=merge",
                   "-p", '{"spec":{"suspend":true}}')  # fmt: skip
    _go(corral, pod)

    def parked() -> dict[str, Any] | None:
        status = (corral.get("session", name) or {}).get("status") or {}
        gone = corral.get("pod", pod) is None
        return status if status.get("phase") == "Suspended" and gone else None

    status = _corral.wait_for("parked, its pod gone", parked, 120, lambda: corral.diagnose(name))
    assert (status["turns"], status["suspensions"], status["suspendedFrom"]) == (1, 1, "Running")
    assert "ONE.md" in _branch_files(corral, f"corral/{name}")
    assert len(corral.model_requests(name)) == 2

    ns = _corral.OPERATOR_NAMESPACE
    corral.kubectl("rollout", "restart", _operator_deployment(), "-n", ns)
    corral.kubectl("rollout", "status", _operator_deployment(), "-n", ns, "--timeout=180s",
                   timeout=200)  # fmt: skip
    _corral.wait_for("a leader after the restart", lambda: _leader(corral), 60)
    assert parked() is not None and len(corral.model_requests(name)) == 2  # it stayed parked

    resumed = time.monotonic()
    corral.kubectl("patch", "session", name, "-n", corral.namespace, "--type=merge",
                   "-p", '{"spec":{"suspend":false}}')  # fmt: skip
    status = corral.wait_phase(name, {"Succeeded", "Failed"}, timeout=240)
    assert status["phase"] == "Succeeded", corral.diagnose(name)
    assert (status["turns"], status["suspensions"], status.get("restarts", 0)) == (2, 1, 0)
    requests = corral.model_requests(name)
    assert len(requests) == 4, [_texts(r)[-200:] for r in requests]  # no turn ran twice
    assert "Wrote ONE.md." in _texts(requests[2])  # the new pod's harness had the conversation
    assert "one" in str(requests[3]["body"]["messages"][-1])  # and its workspace turn 1's file
    assert {"ONE.md", "TWO.md"} <= _branch_files(corral, f"corral/{name}")
    record_tier_time("node", "suspend -> resume across an operator restart",
                     time.monotonic() - resumed)  # fmt: skip


def _operator_pids(pod: str) -> list[int]:
    """The host's processes of `pod`'s operator container (the node is this host): the
    container's environment names its pod (HOSTNAME)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"HOSTNAME={pod}".encode() in environ and b"corral" in cmdline:
            found.append(int(proc.name))
    return found


@pytest.mark.timeout(900)
def test_the_leading_operator_killed_mid_turn_every_session_succeeds_admitted_once(
    corral: Corral,
) -> None:
    """The chart's two operator replicas on the real node: every process of the leader's
    container gets SIGKILL while 5 Sessions' turns hold in their pods (each command waits for
    the test's GO, so the turns overlap however slowly the node starts the pods); the standby
    takes the Lease and every Session Succeeds, each turn admitted once (the model's count)."""
    names = [f"burst-{i}" for i in range(5)]
    corral.load_script({"conversations": {name: [
        {"tool_use": {"name": "bash", "input": {"command": HOLD, "timeout": 600}}},
        {"text": "Finished under whichever operator leads."},
    ] for name in names}})  # fmt: skip
    # The node has 2 cores: at the default requests (400m a pod) the scheduler fits only some
    # of the 5 pods beside the operators and the gateways, and the rest wait for a turn to end.
    agent = _corral.agent_doc(sandbox={"resources": {"requests": {"cpu": "10m"}}})
    agent["metadata"]["name"] = "burst-agent"
    sessions = [_corral.session_doc(n, corral.git_url, keepSandbox=False) for n in names]
    for session in sessions:
        session["spec"]["agentRef"] = "burst-agent"
    corral.apply(agent, *sessions)
    applied, holding = time.monotonic(), []
    for name in names:
        _corral.wait_for(f"{name}'s turn holding", lambda n=name: _held(corral, n), 480,
                         lambda n=name: corral.diagnose(n))  # fmt: skip
        holding.append(round(time.monotonic() - applied))
    print(f"the 5 turns held their commands {holding} s after the apply")
    leader = _corral.wait_for("a leader", lambda: _leader(corral), 30)
    pids = _operator_pids(leader)
    assert pids, f"no process of {leader}'s operator found on this host"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()

    def new_leader() -> str:
        now = _leader(corral)
        return now if now not in ("", leader) else ""

    standby = _corral.wait_for("the standby to lead", new_leader, 90)
    takeover = time.monotonic() - killed
    ended = [n for n in names if not _held(corral, n)]
    assert not ended, f"turns no longer in flight across the takeover: {ended}\n" + "\n".join(
        corral.diagnose(n) for n in ended
    )
    for name in names:
        _go(corral, f"corral-{name}")
    for name in names:
        status = corral.wait_phase(name, {"Succeeded", "Failed"}, timeout=180)
        assert status["phase"] == "Succeeded", corral.diagnose(name)
        assert status["turns"] == 1 and not status.get("restarts"), status
        assert len(corral.model_requests(name)) == 2, name  # admitted once, answered once
    record_tier_time("node", "takeover after SIGKILL (real node)", takeover)
    assert standby != leader
    print(f"takeover after SIGKILL with 5 turns in flight: {takeover:.1f}s")
