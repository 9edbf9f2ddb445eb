"""The leader election's rules (operator/corral_operator/leadership.py): pure, by the clock of
the process that reads the Lease, never by the record's own timestamps."""

from __future__ import annotations

import pytest

from corral_operator.leadership import LeaseTerms, Seen, decide, micro_time, parse_lease
from corral_operator.main import parse_args

ME = "operator-b_1234"


def held(holder: str, renewed: str = "2026-12-04T07:00:00.000000Z", duration: int = 15) -> dict:
    return {"holderIdentity": holder, "renewTime": renewed, "leaseDurationSeconds": duration}


def test_no_lease_is_created_and_a_released_or_own_lease_is_taken_at_once() -> None:
    assert decide(None, ME, None, 100.0)[0] == "create"
    assert decide({"leaseDurationSeconds": 1}, ME, None, 100.0)[0] == "take"  # released
    assert decide(held(ME), ME, None, 100.0)[0] == "take"


def test_a_live_leader_is_waited_for_until_its_record_stood_still_a_whole_duration() -> None:
    move, seen = decide(held("operator-a"), ME, None, 100.0)
    assert move == "wait" and seen.at == 100.0
    # The same record later on: the leader may have died at any moment since it was first seen.
    assert decide(held("operator-a"), ME, seen, 114.9)[0] == "wait"
    assert decide(held("operator-a"), ME, seen, 115.0)[0] == "take"


def test_a_renewal_restarts_the_wait_however_old_its_timestamp_looks() -> None:
    _, seen = decide(held("operator-a"), ME, None, 100.0)
    # A renewal whose renewTime is an hour behind (the leader's node clock is off) still counts
    # as a sign of life: only the change matters, on this process's own clock.
    renewed = held("operator-a", renewed="2026-12-04T06:00:02.000000Z")
    move, again = decide(renewed, ME, seen, 114.0)
    assert move == "wait" and again.at == 114.0
    assert decide(renewed, ME, again, 128.9)[0] == "wait"
    assert decide(renewed, ME, again, 129.0)[0] == "take"


def test_the_leases_own_duration_decides_not_this_processs_terms() -> None:
    _, seen = decide(held("operator-a", duration=60), ME, None, 0.0)
    assert decide(held("operator-a", duration=60), ME, seen, 30.0)[0] == "wait"
    assert decide(held("operator-a", duration=60), ME, seen, 60.0)[0] == "take"


def test_a_new_holder_is_a_change_too() -> None:
    seen = Seen("operator-a", "2026-12-04T07:00:00.000000Z", 15.0, at=0.0)
    move, now_seen = decide(held("operator-c"), ME, seen, 20.0)
    assert move == "wait" and now_seen.holder == "operator-c" and now_seen.at == 20.0


def test_terms_must_leave_the_leader_time_to_stop_before_a_standby_may_lead() -> None:
    assert LeaseTerms().takeover_bound == 19.0
    with pytest.raises(ValueError, match="renew deadline < lease duration"):
        LeaseTerms(duration=10, renew_deadline=10, retry_period=2)
    with pytest.raises(ValueError):
        LeaseTerms(duration=15, renew_deadline=10, retry_period=0)


def test_micro_time_is_the_leases_format() -> None:
    assert micro_time().endswith("Z") and len(micro_time()) == len("2026-12-04T07:00:00.000000Z")


def test_the_operators_leader_flags_are_checked() -> None:
    assert parse_lease("corral-system/corral-operator") == ("corral-system", "corral-operator")
    for bad in ("corral-operator", "/x", "a/", "a/b/c"):
        with pytest.raises(ValueError):
            parse_lease(bad)
    with pytest.raises(SystemExit):
        parse_args(["-n", "x", "--leader-elect-lease", "nope"])
    with pytest.raises(SystemExit):
        parse_args(["-n", "x", "--leader-elect-lease=a/b", "--leader-elect-renew-deadline=20"])
    args = parse_args(["-n", "x", "--leader-elect-lease", "a/b"])
    assert args.leader_elect_lease == ("a", "b") and args.leader_elect_retry_period == 2.0
