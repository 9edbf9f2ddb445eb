"""A Session outlives its pod (issue 27; docs/turns.md, "A lost pod"): with an archive, the
conversation's log is archived at every admission and settlement, and a Session whose pod is
deleted mid-turn resumes in a new pod from the archived conversation and its delivered branch.
On the real API server, the local node and the scripted model, the operator under the chart's
RBAC; the remote is a real `git daemon`."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.custodian._custodian_proc import git, git_daemon

from ._operator_fixtures import (
    OperatorExtras,
    OperatorHandle,
    ScriptedModelHandle,
    agent_doc,
    session_doc,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)

_SERVED = Path.home() / ".cache" / "corral" / "test-repos"
DELAY = 20  # seconds turn 2's first model call is held: the pod goes while it waits


@pytest.fixture
def archive_dir() -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="corral-archive-"))
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def operator_extras(archive_dir: Path) -> OperatorExtras:
    """The operator archives (the `operator` fixture asks for this)."""
    return OperatorExtras(args=lambda: ["--archive-dir", str(archive_dir)])


@pytest.fixture
def remote(git_repo: Path) -> Iterator[tuple[str, Path]]:
    _SERVED.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="served-", dir=_SERVED))
    try:
        git(base, "clone", "-q", "--bare", str(git_repo), str(base / "shop.git"))
        with git_daemon(base) as url:
            yield url + "shop.git", base / "shop.git"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _reasons(op: OperatorHandle, name: str) -> list[str]:
    return [e["reason"] for e in op.events(name)]


def _branch_files(bare: Path, branch: str) -> set[str]:
    listed = subprocess.run(
        ["git", "-C", str(bare), "ls-tree", "--name-only", branch],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return set(listed.stdout.split())


def _texts(request: dict[str, Any]) -> str:
    return str(request["body"]["messages"])


def _chunks_holding(archive: Path, text: str) -> list[Path]:
    return [c for c in archive.glob(".conversation-*/*.ndjson") if text in c.read_text()]


def _cut_before(runs: Path, submission: str) -> None:
    """The archived log without the admission of `submission` and what followed it (as if the
    pod had gone just before the catch-up): the chunk holding it is cut there and renamed for
    the records it keeps, later chunks removed."""
    chunks = sorted(runs.glob(".conversation-*/*.ndjson"))  # their names sort by first record
    marker = f'"id":"{submission}"'
    holder = next(c for c in chunks if any(
        '"k":"sub"' in line and marker in line for line in c.read_text().splitlines()))  # fmt: skip
    for later in chunks[chunks.index(holder) :]:
        lines = later.read_text().splitlines(keepends=True)
        later.unlink()
        if later == holder:
            at = next(i for i, line in enumerate(lines) if marker in line)
            start = int(later.name.split("-")[0])
            if at:
                kept = later.with_name(f"{start:012d}-{start + at:012d}.ndjson")
                kept.write_text("".join(lines[:at]))


@pytest.mark.parametrize("archived", ["admission-archived", "admission-lost"])
def test_a_session_whose_pod_is_deleted_mid_turn_resumes_and_succeeds_with_its_work(
    operator: OperatorHandle,
    scripted_model: ScriptedModelHandle,
    remote: tuple[str, Path],
    archive_dir: Path,
    archived: str,
) -> None:
    url, bare = remote
    name = f"{operator.namespace}-{archived}"
    write_one = {"tool_use": {"name": "bash", "input": {"command": "echo one > ONE.md"}}}
    scripted_model.load({"conversations": {name: [
        write_one,
        {"text": "Wrote ONE.md."},  # turn 1 ends: delivered, but the guard wants more
        {"text": "never seen: the pod goes first", "delay": DELAY},  # turn 2, in flight
        {"tool_use": {"name": "bash", "input": {"command": "cat ONE.md && echo two > TWO.md"}}},
        {"text": "ALL DONE: ONE.md and TWO.md."},
    ]}})  # fmt: skip
    guard = {"criteria": {"substring": "ALL DONE"}, "turnBudget": 4}
    session = session_doc(name, Path("."), evaluation=guard)
    session["spec"]["workspace"]["repo"] = url
    operator.apply(agent_doc(), session)

    def turn_two_in_flight() -> dict[str, Any] | None:
        ledger = operator.session_status(name).get("ledger")
        return ledger if ledger and ledger.get("turn") == 2 else None

    ledger = wait_for("turn 2 in flight", turn_two_in_flight, 120)
    first = operator.session_status(name)
    delivered = first["delivery"]["revision"]
    assert "ONE.md" in _branch_files(bare, f"corral/{name}")
    # Turn 2's admission reached the archive (a log chunk) before the pod goes; or, for the
    # second case, its chunk is removed, as if the pod had gone before the catch-up.
    runs = archive_dir / operator.namespace / name
    wait_for("turn 2's admission archived", lambda: _chunks_holding(runs, ledger["submissionId"]))
    if archived == "admission-lost":
        _cut_before(runs, ledger["submissionId"])
    old_pod = operator.get("pod", f"corral-{name}")
    assert old_pod is not None
    operator.cp.kubectl("delete", "pod", f"corral-{name}", "-n", operator.namespace,
                        "--wait=false")  # fmt: skip
    deleted = time.monotonic()

    status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=180)
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 1 and status["resumeInterruptions"] == 1
    resumed = next(c for c in status["conditions"] if c["type"] == "Resumed")
    assert resumed["reason"] == "PodDeleted" and "restart 1 of at most 3" in resumed["message"]
    assert status["turns"] == 2  # the interrupted attempt is not a turn of its own
    new_pod = operator.get("pod", f"corral-{name}")
    assert new_pod is None or new_pod["metadata"]["uid"] != old_pod["metadata"]["uid"]

    # The model saw the whole conversation again, and was told what was lost.
    requests = scripted_model.requests(name)
    assert len(requests) == 5, [_texts(r)[-200:] for r in requests]
    resumed_request = _texts(requests[3])
    assert "Wrote ONE.md." in resumed_request and "sandbox pod it ran in was lost" in (
        resumed_request
    )
    assert delivered[:12] in resumed_request
    # The new pod started from the delivered branch: ONE.md was there for `cat`.
    results = str(requests[4]["body"]["messages"][-1])
    assert "one" in results, results
    assert {"ONE.md", "TWO.md"} <= _branch_files(bare, f"corral/{name}")
    reasons = _reasons(operator, name)
    assert reasons.count("Resumed") == 1, reasons
    wait_for("every admission's Event", lambda: _reasons(operator, name).count("TurnAdmitted") >= 3)
    assert ledger["submissionId"] not in str(status.get("ledger"))
    # The new harness was given the archived conversation: the turn in flight settled there.
    logs = operator.logs()
    assert "conversation restored in the new pod" in logs, logs[-3000:]
    interrupted = "interrupted: none" if archived == "admission-lost" else "interrupted: sub_"
    assert interrupted in logs, logs[-3000:]
    # The lost pod's model call is still held at the scripted model: let it end there, so the
    # model server stops at once when its fixture ends.
    time.sleep(max(0.0, DELAY + 1 - (time.monotonic() - deleted)))


def _wip_kept(archive: Path, namespace: str, name: str) -> list[Path]:
    return list((archive / namespace / name).glob(f".wip-*/wip/{name}.bundle"))


def test_the_work_in_progress_of_a_turn_cut_short_comes_back_in_the_new_pod(
    operator: OperatorHandle,
    scripted_model: ScriptedModelHandle,
    remote: tuple[str, Path],
    archive_dir: Path,
) -> None:
    """Mid-turn, the agent changed the worktree and delivered nothing yet: the operator keeps
    its work in progress in the archive (every wipIntervalSeconds, never on the remote), and
    the new pod's worktree has it back, uncommitted, when the turn is admitted again."""
    url, bare = remote
    name = f"{operator.namespace}-wip"
    work = "echo work in progress > WIP.md && rm README.md && echo changed"
    scripted_model.load({"conversations": {name: [
        {"tool_use": {"name": "bash", "input": {"command": work}}},
        {"text": "never seen: the pod goes first", "delay": DELAY},
        {"tool_use": {"name": "bash", "input": {"command": "cat WIP.md; ls; git status --short"}}},
        {"text": "Done with WIP.md."},
    ]}})  # fmt: skip
    session = session_doc(name, Path("."))
    session["spec"]["workspace"]["repo"] = url
    operator.apply(agent_doc(workspace={"wipIntervalSeconds": 1}), session)

    wait_for("the work in progress kept", lambda: _wip_kept(archive_dir, operator.namespace, name),
             120)  # fmt: skip
    assert operator.session_status(name).get("ledger"), "the turn is still in flight"
    assert not _has_branch(bare, name)  # nothing delivered yet: the turn has not ended
    operator.cp.kubectl("delete", "pod", f"corral-{name}", "-n", operator.namespace,
                        "--wait=false")  # fmt: skip
    deleted = time.monotonic()

    status = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=180)
    assert status["phase"] == "Succeeded", status
    assert (status["restarts"], status["resumeInterruptions"], status["turns"]) == (1, 1, 1)
    requests = scripted_model.requests(name)
    assert len(requests) == 4, [_texts(r)[-200:] for r in requests]
    note = _texts(requests[2])
    assert "work in progress saved at" in note and "back in the worktree" in note, note[-600:]
    shown = str(requests[3]["body"]["messages"][-1])
    # The new checkout had the file written and the file removed, as the agent left them.
    assert "work in progress" in shown and "D README.md" in shown and "?? WIP.md" in shown, shown
    assert "work in progress of" in operator.logs()
    # Never on the remote: only the Session's branch, which the resumed turn delivered.
    refs = subprocess.run(["git", "-C", str(bare), "for-each-ref", "--format=%(refname)"],
                          capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert [r for r in refs if not r.startswith("refs/heads/")] == [], refs
    assert set(refs) == {"refs/heads/main", f"refs/heads/corral/{name}"}, refs
    assert "WIP.md" in _branch_files(bare, f"corral/{name}")
    # The settlement dropped it: nothing stale is left to lay over a later checkout.
    assert not _wip_kept(archive_dir, operator.namespace, name)
    time.sleep(max(0.0, DELAY + 1 - (time.monotonic() - deleted)))


def _has_branch(bare: Path, name: str) -> bool:
    found = subprocess.run(["git", "-C", str(bare), "rev-parse", "--verify", "-q",
                            f"refs/heads/corral/{name}"], capture_output=True)  # fmt: skip
    return found.returncode == 0
