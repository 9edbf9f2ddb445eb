"""How every reader reads an Approval back (`corral_api.decisions`: the CLI's tables and
`corral approve`, the console, the custodian, the operator's planners and metrics), and the
object ages they print (`corral_api.timestamps.age`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, get_args

import pytest

from corral_api.decisions import (
    DECISIONS,
    PENDING,
    approval_action,
    approval_decision,
    approval_session,
    decision_of_verdict,
    decision_patch,
)
from corral_api.kinds import FINAL_PHASES, SessionPhase
from corral_api.timestamps import age, now_rfc3339, parse_rfc3339


@pytest.mark.parametrize(
    ("approval", "decision"),
    [
        ({}, "Pending"),
        ({"status": None}, "Pending"),
        ({"status": {}}, "Pending"),
        ({"status": {"decision": ""}}, "Pending"),
        ({"status": {"decision": "Pending"}}, "Pending"),
        ({"status": {"decision": "Approved", "decidedBy": "alice"}}, "Approved"),
        ({"status": {"decision": "Denied"}}, "Denied"),
    ],
)
def test_an_approval_without_a_decision_reads_as_pending(
    approval: dict[str, Any], decision: str
) -> None:
    assert approval_decision(approval) == decision
    assert (decision == PENDING) is (decision not in DECISIONS)


def test_a_local_files_verdict_reads_as_the_approvals_decision() -> None:
    assert decision_of_verdict("approved") == "Approved"
    assert decision_of_verdict("denied") == "Denied"
    assert decision_of_verdict(None) == "Pending"
    assert decision_of_verdict("maybe") == "Pending"


def test_the_call_and_the_session_an_approval_names() -> None:
    approval = {
        "spec": {
            "sessionRef": {"name": "s1", "uid": "u1"},
            "action": {"tool": "bash", "arguments": '{"command": "git push"}'},
        }
    }
    assert approval_action(approval) == 'bash {"command": "git push"}'
    assert approval_session(approval) == "s1"
    assert approval_action({}) == "? {}"
    assert approval_session({"spec": {"sessionRef": None}}) == ""


def test_a_decision_is_written_as_a_compare_and_swap_on_the_resource_version() -> None:
    approval = {"metadata": {"name": "a1", "resourceVersion": "42"}, "status": {}}
    now = datetime(2026, 12, 1, 8, 30, tzinfo=UTC)
    assert decision_patch(approval, "Approved", "alice", "ok", now) == {
        "metadata": {"resourceVersion": "42"},
        "status": {
            "decision": "Approved",
            "decidedBy": "alice",
            "decidedAt": "2026-12-01T08:30:00Z",
            "comment": "ok",
        },
    }


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("timestamp", "shown"),
    [
        ("2026-12-01T11:59:15Z", "45s"),
        ("2026-12-01T11:57:00Z", "3m"),
        ("2026-12-01T09:59:59Z", "2h"),
        ("2026-11-27T12:00:00Z", "4d"),
        ("2026-12-01T12:00:30Z", "0s"),  # a clock ahead of ours never shows a negative age
    ],
)
def test_an_age_is_kubectls(timestamp: str, shown: str) -> None:
    assert age(timestamp, NOW) == shown


def test_an_age_without_a_timestamp_is_what_the_caller_shows_for_none() -> None:
    assert age(None, NOW) == ""
    assert age("yesterday", NOW) == ""
    assert age(None, NOW, unknown="<unknown>") == "<unknown>"


def test_now_is_an_rfc3339_utc_timestamp_of_whole_seconds() -> None:
    text = now_rfc3339()
    parsed = parse_rfc3339(text)
    assert parsed is not None and text.endswith("Z") and len(text) == len("2026-12-01T12:00:00Z")
    assert abs(parsed.timestamp() - datetime.now(UTC).timestamp()) < 5


def test_only_the_ends_of_a_session_are_final() -> None:
    assert set(FINAL_PHASES) <= set(get_args(SessionPhase))
    assert not {"Pending", "Running", "WaitingForHuman", "WaitingForChildren",
                "WaitingForWake"} & FINAL_PHASES  # fmt: skip
