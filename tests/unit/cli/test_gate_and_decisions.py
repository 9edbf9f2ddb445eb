"""The pure parts of `corral evidence check` and `corral approve|deny`: durations, the verdict
per check at a revision, the gate's one verdict, and the status a person writes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from corral_api.decisions import decision_status
from corral_api.digest import check_definition_digest
from corral_api.evidence import verdicts_at
from corral_api.labels import evidence_labels
from corral_cli._cluster import parse_duration
from corral_cli.evidence_cmd import EXIT_BY_VERDICT, overall
from corral_common.approval_files import ApprovalFiles, ApprovalNotFound, ApprovalScopeMismatch

REPO = "https://git.example.test/shop.git"
REV = "a" * 40


def evidence(
    name: str,
    check: str = "unit",
    command: str = "make test",
    verdict: str | None = None,
    finished: str = "2026-11-30T10:00:00Z",
    created: str = "2026-11-30T09:00:00Z",
    digest_of: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "creationTimestamp": created,
            "labels": evidence_labels(check, REV, REPO),
        },
        "spec": {
            "repo": REPO,
            "revision": REV,
            "check": check,
            "command": command,
            "definitionDigest": check_definition_digest(digest_of or command, None),
        },
    }
    if verdict is not None:
        body["status"] = {"verdict": verdict, "finished": finished}
    return body


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("0", 0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten", "5x", "-3s", "m"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_the_verdict_per_check_takes_the_current_definition_and_the_newest_verdict() -> None:
    found = [
        evidence("u1", verdict="Fail", finished="2026-11-30T10:00:00Z"),
        evidence("u2", verdict="Pass", finished="2026-11-30T11:00:00Z"),
        evidence("lint", check="lint", command="ruff", verdict="Fail"),
        # A forged digest (it claims `make test`, ran `true`) counts for nothing.
        evidence(
            "forged",
            command="true",
            digest_of="make test",
            verdict="Pass",
            created="2026-11-30T12:00:00Z",
        ),
    ]
    assert verdicts_at(found, REV, REPO, namespace="ns") == {"lint": "Fail", "unit": "Pass"}
    assert verdicts_at(found, REV, REPO, "unit") == {"unit": "Pass"}
    assert verdicts_at(found, REV, REPO, "docs") == {}
    assert verdicts_at(found, "b" * 40, REPO) == {}
    assert verdicts_at(found, REV, REPO + "x") == {}
    # A redefined check: only the newest definition's Evidence counts.
    redefined = evidence("u3", command="make check", created="2026-11-30T13:00:00Z")
    assert verdicts_at([*found, redefined], REV, REPO, "unit") == {"unit": "Pending"}


@pytest.mark.parametrize(
    ("verdicts", "gate", "code"),
    [
        ({"a": "Pass", "b": "Pass"}, "Pass", 0),
        ({"a": "Pass", "b": "Fail"}, "Fail", 1),
        ({"a": "Error", "b": "Fail"}, "Fail", 1),
        ({"a": "Pass", "b": "Error"}, "Error", 2),
        ({}, "Missing", 2),
        ({"a": "Pass", "b": "Pending"}, "Pending", 3),
    ],
)
def test_the_gate_has_one_verdict_and_one_exit(
    verdicts: dict[str, str], gate: str, code: int
) -> None:
    assert overall(verdicts) == gate
    assert EXIT_BY_VERDICT[gate] == code


@pytest.mark.parametrize(
    "argv",
    [
        ["check"],  # --repo and --revision missing
        ["check", "--repo", REPO, "--revision", "abc"],
        ["check", "--repo", REPO, "--revision", REV, "--wait", "soon"],
        ["verify"],
        [],
    ],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from corral_cli.main import main as corral

    assert corral(["evidence", *argv]) == 2
    assert capsys.readouterr().err or not argv


def test_an_unreadable_kubeconfig_exits_2_never_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from corral_cli.main import main as corral

    missing = tmp_path / "nope"
    argv = ["evidence", "check", "--repo", REPO, "--revision", REV, "--kubeconfig", str(missing)]
    assert corral(argv) == 2
    assert f"no kubeconfig: --kubeconfig {missing} does not exist" in capsys.readouterr().err


def test_a_decision_names_who_when_and_why() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert decision_status("Denied", "alice", "not now", now) == {
        "decision": "Denied",
        "decidedBy": "alice",
        "decidedAt": "2026-11-30T12:00:00Z",
        "comment": "not now",
    }
    assert "comment" not in decision_status("Approved", "alice", "", now)


def test_the_local_store_binds_a_decision_to_its_scope_and_call(tmp_path: Path) -> None:
    files = ApprovalFiles(tmp_path)
    record = files.create(scope="s1", tool="bash", arguments={"command": "git merge x"}, reason="r")
    assert files.decision(record["id"], scope="s1") is None
    with pytest.raises(ApprovalNotFound):
        files.decision(record["id"], scope="s2")  # another session's wait learns nothing
    with pytest.raises(ApprovalScopeMismatch):
        files.decide(record["id"], "approved", by="p", scope="s2")
    with pytest.raises(ApprovalScopeMismatch):
        files.decide(record["id"], "approved", by="p", digest="sha256:" + "0" * 64)
    with pytest.raises(ApprovalNotFound):
        files.read("../../etc/passwd")
    files.decide(record["id"], "approved", by="p", scope="s1", digest=record["digest"])
    assert files.decision(record["id"], scope="s1") == "approved"
    with pytest.raises(ValueError, match="already approved"):
        files.decide(record["id"], "denied", by="p")
    assert files.pending() == []


def test_get_names_the_kind_it_lists(capsys: pytest.CaptureFixture[str]) -> None:
    from corral_cli.main import main as corral

    assert corral(["get", "widgets"]) == 2
    err = capsys.readouterr().err
    assert "unknown kind 'widgets'" in err and "approvals" in err
