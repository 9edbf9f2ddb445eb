"""The pure judgements of delivery (docs/delivery.md) and of waiting for children
(docs/children.md): what a delivery record means for the Session, when a parent resumes by its
wait mode, and the one line each child sews back."""

from __future__ import annotations

from typing import Any

import pytest

from corral_api.kinds import WaitingFor
from corral_api.wire import DeliveryRecord
from corral_operator.driver import children_report, running_children, wait_satisfied
from corral_operator.driver._children import waiting_for_of
from corral_operator.planning.delivery import judge_delivery

SHA = "a" * 40


def _record(state: str, **kw: Any) -> DeliveryRecord:
    return DeliveryRecord.model_validate(
        {"state": state, "branch": "corral/s", "submissionId": "sub-1", "message": "m"} | kw
    )


def test_a_delivered_turn_is_recorded_and_the_condition_is_true() -> None:
    verdict = judge_delivery(
        _record("Delivered", revision=SHA, pushedAt="2026-01-01T00:00:00Z"), "sub-1", "Succeeded"
    )
    assert verdict is not None and verdict.fails_session is None
    assert (verdict.status, verdict.reason) == ("True", "Delivered")
    assert verdict.delivery.revision == SHA and verdict.delivery.branch == "corral/s"


def test_nothing_to_deliver_is_not_a_failure() -> None:
    verdict = judge_delivery(_record("NothingToDeliver"), "sub-1", "Succeeded")
    assert verdict is not None and verdict.fails_session is None
    assert (verdict.status, verdict.reason) == ("True", "NothingToDeliver")


@pytest.mark.parametrize(
    ("phase", "fails"), [("Succeeded", True), ("Failed", False), ("WaitingForChildren", False)]
)
def test_a_failed_delivery_fails_only_a_session_that_would_have_succeeded(
    phase: str, fails: bool
) -> None:
    verdict = judge_delivery(_record("Failed", message="rejected"), "sub-1", phase)
    assert verdict is not None and (verdict.status, verdict.reason) == ("False", "DeliveryFailed")
    assert (verdict.fails_session is not None) is fails
    if fails:
        assert verdict.fails_session == "the work was not delivered: rejected"


def test_a_repo_without_a_remote_says_so_and_the_outcome_stands() -> None:
    verdict = judge_delivery(_record("Failed", noRemote=True), "sub-1", "Succeeded")
    assert verdict is not None and verdict.fails_session is None
    assert (verdict.status, verdict.reason) == ("False", "NoRemote")


def test_a_record_of_another_turn_is_not_judged() -> None:
    assert judge_delivery(_record("Failed"), "sub-2", "Succeeded") is None
    assert judge_delivery(_record("Failed"), None, "Succeeded") is None


def _child(name: str, phase: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": phase, **status}}


def test_all_waits_for_every_child() -> None:
    kids = [_child("a", "Succeeded"), _child("b", "Running")]
    assert running_children(kids) == 1
    assert not wait_satisfied(None, kids, [])
    assert not wait_satisfied(WaitingFor(mode="all"), kids, [])
    assert wait_satisfied(None, [_child("a", "Succeeded"), _child("b", "Failed")], ["a", "b"])


def test_first_resumes_on_each_child_not_reported_yet() -> None:
    first = WaitingFor(mode="first")
    kids = [_child("a", "Running"), _child("b", "Running")]
    assert not wait_satisfied(first, kids, [])
    kids[0] = _child("a", "Failed")
    assert wait_satisfied(first, kids, [])
    assert not wait_satisfied(first, kids, ["a"])  # already reported: wait for the next


def test_supervise_wakes_the_parent_at_every_childs_end() -> None:
    supervise = WaitingFor(mode="supervise")
    kids = [_child("a", "Succeeded"), _child("b", "Running"), _child("c", "Running")]
    assert wait_satisfied(supervise, kids, [])
    assert not wait_satisfied(supervise, kids, ["a"])
    kids[2] = _child("c", "Succeeded")
    assert wait_satisfied(supervise, kids, ["a"])


def test_quorum_resumes_at_n_successes_or_when_n_is_out_of_reach() -> None:
    quorum = WaitingFor(mode="quorum", quorum=2)
    kids = [_child("a", "Succeeded"), _child("b", "Running"), _child("c", "Running")]
    assert not wait_satisfied(quorum, kids, [])
    kids[1] = _child("b", "Succeeded")
    assert wait_satisfied(quorum, kids, [])
    lost = [_child("a", "Failed"), _child("b", "Failed"), _child("c", "Running")]
    assert wait_satisfied(quorum, lost, [])  # 2 can no longer succeed
    # Without a number: a majority.
    majority = WaitingFor(mode="quorum")
    assert not wait_satisfied(majority, [_child("a", "Succeeded"), *kids[2:]], [])


def test_a_named_group_is_all_that_is_waited_for() -> None:
    group = WaitingFor(mode="all", children=["a"])
    kids = [_child("a", "Succeeded"), _child("b", "Running")]
    assert wait_satisfied(group, kids, [])


def test_the_wait_children_input_becomes_the_wait() -> None:
    assert waiting_for_of({"mode": "quorum", "quorum": 2}) == WaitingFor(mode="quorum", quorum=2)
    assert waiting_for_of({"mode": "nonsense"}) == WaitingFor()
    assert waiting_for_of({}) == WaitingFor()


def test_each_finished_child_reports_one_line_once() -> None:
    kids = [
        _child(
            "a",
            "Succeeded",
            answer="Fixed the\nbug.",
            delivery={"branch": "corral/a", "revision": SHA, "state": "Delivered"},
        ),
        _child("b", "Failed", message="turn 1 failed (api_error: boom)"),
        _child("c", "Running"),
        _child("d", "Succeeded", answer="old news"),
    ]
    report = children_report(WaitingFor(mode="supervise"), kids, ["d"])
    assert report.names == ("a", "b")
    lines = report.message.splitlines()
    assert lines[0] == "Your child sessions report back (wait mode: supervise):"
    assert lines[1] == f"- child a: Succeeded: Fixed the bug. (pushed corral/a at {SHA})"
    assert lines[2] == "- child b: Failed: turn 1 failed (api_error: boom) (pushed nothing)"
    assert "Still running: c." in report.message and "old news" not in report.message
