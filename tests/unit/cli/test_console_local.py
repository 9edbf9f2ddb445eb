"""`corral console --state` over real state directories (cli/corral_cli/_console_local.py):
runs are named by their Session, not their directory; a person's reason is written with their
decision into the local approval file; a namespace other than `local` holds nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from corral_cli._console_local import APPROVALS, LocalAccess, LocalSource, find_runs
from corral_common.approval_files import ApprovalFiles
from corral_operator.console.access import Refused


def _run(home: Path, directory: str, session: str | None, started: str, mtime: float) -> Path:
    """A run's directory as `corral run` leaves it: state.json, and its Session's record under
    sessions/ (none for a run that stopped before writing it)."""
    run = home / "runs" / directory
    (run / "sessions").mkdir(parents=True)
    (run / "state.json").write_text(json.dumps({"phase": "Succeeded", "startedAt": started}))
    if session is not None:
        record = {"metadata": {"name": session, "namespace": "local", "uid": f"uid-{directory}"},
                  "spec": {"agentRef": "fixer", "task": f"task of {directory}"}}  # fmt: skip
        (run / "sessions" / f"{session}.json").write_text(json.dumps(record))
        child = {"metadata": {"name": f"{session}-child"}, "spec": {"parentRef": {"name": session}}}
        (run / "sessions" / f"{session}-child.json").write_text(json.dumps(child))
    os.utime(run, (mtime, mtime))
    return run


def test_runs_are_named_by_their_session_and_the_latest_run_of_a_name_has_it(
    tmp_path: Path,
) -> None:
    older = _run(
        tmp_path, "fix-discount-20261130-101010", "fix-discount", "2026-11-30T10:10:10Z", 1
    )
    latest = _run(
        tmp_path, "fix-discount-20261201-090000", "fix-discount", "2026-12-01T09:00:00Z", 2
    )
    other = _run(tmp_path, "land", "land-it", "2026-12-01T08:00:00Z", 3)
    bare = _run(tmp_path, "half-started", None, "", 4)
    runs = find_runs(tmp_path)
    assert runs == {
        "fix-discount": latest,
        "fix-discount-20261130-101010": older,
        "land-it": other,
        "half-started": bare,
    }
    assert find_runs(latest) == {"fix-discount": latest}  # one run's own directory


async def test_a_session_is_its_records_and_other_namespaces_hold_nothing(tmp_path: Path) -> None:
    run = _run(tmp_path, "land", "land-it", "2026-12-01T08:00:00Z", 3)
    source = LocalSource(tmp_path)
    session = await source.get("Session", "local", "land-it")
    assert session is not None
    assert session["metadata"]["name"] == "land-it" and session["metadata"]["uid"] == "uid-land"
    assert session["spec"]["task"] == "task of land"
    assert session["metadata"]["annotations"]["corral.dev/state-dir"] == str(run)
    assert await source.get("Session", "local", "land") is None  # the directory's name is not it
    assert await source.get("Session", "default", "land-it") is None
    # Everything here is the person's to read: the console answers 404 for what is not here,
    # never 403 (nothing is hidden from them).
    access = LocalAccess(source)
    me = await access.authenticate(None)
    assert await access.allowed(me, "get", "sessions", "default")
    # No git checkout recorded: nothing to read changes from, said plainly.
    changes = await source.changes(session)
    assert changes is not None and "outside git" in changes["unavailable"]


async def test_the_reason_given_is_written_with_the_decision(tmp_path: Path) -> None:
    run = _run(tmp_path, "land", "land-it", "2026-12-01T08:00:00Z", 3)
    files = ApprovalFiles(run / APPROVALS)
    asked = files.create(scope="land-it", tool="bash", arguments={"command": "git merge x"},
                         reason="git merge always needs a human decision")  # fmt: skip
    source = LocalSource(tmp_path)
    access = LocalAccess(source)
    me = await access.authenticate(None)
    written = await access.decide(me, "local", asked["id"], "Denied", "  not before the release  ")
    assert written["status"]["decision"] == "Denied"
    assert written["status"]["comment"] == "not before the release"
    assert written["spec"]["sessionRef"]["name"] == "land-it"
    on_disk = json.loads(files.path(asked["id"]).read_text())
    assert on_disk["decision"] == "denied" and on_disk["comment"] == "not before the release"
    (listed,) = await source.objects("Approval", "local")
    assert listed["status"]["comment"] == "not before the release"
    with pytest.raises(Refused) as again:
        await access.decide(me, "local", asked["id"], "Approved", "")
    assert again.value.status == 409
