"""The gateway's records as a Session shows them (docs/egress.md): every replica's answer
summed per destination, at most 20 destinations in status (denied first), no write for the
time alone, and one Warning per denied destination, never again after a restart."""

from __future__ import annotations

from typing import Any

from corral_api.kinds import SessionStatus
from corral_operator.egressrecords import (
    EgressRecords,
    denial_events,
    merge_replicas,
    summary,
    with_egress,
)


def _host(host: str, decision: str = "allowed", **more: Any) -> dict[str, Any]:
    return {
        "host": host,
        "port": 443,
        "identity": "agent",
        "decision": decision,
        "count": 1,
        "bytesUp": 10,
        "bytesDown": 100,
        "firstSeen": "2026-12-02T10:00:00Z",
        "lastSeen": "2026-12-02T10:00:00Z",
        **more,
    }


def _answer(*hosts: dict[str, Any], session: str = "s1") -> dict[str, Any]:
    return {"sessions": [{"namespace": "team", "session": session, "hosts": list(hosts)}]}


def test_two_replicas_answers_add_up_per_destination() -> None:
    one = _answer(_host("pypi.org", count=2, firstSeen="2026-12-02T10:00:05Z"))
    two = _answer(
        _host("pypi.org", count=3, lastSeen="2026-12-02T10:09:00Z"),
        _host("evil.example", "denied", reason="not allowed"),
    )
    evidence = {"sessions": [{"namespace": "team", "session": "", "hosts": [_host("x.org")]}]}
    merged = merge_replicas([one, two, evidence])
    assert list(merged) == [("team", "s1")]
    pypi = next(h for h in merged[("team", "s1")] if h["host"] == "pypi.org")
    assert (pypi["count"], pypi["bytesUp"], pypi["bytesDown"]) == (5, 20, 200)
    assert pypi["firstSeen"] == "2026-12-02T10:00:00Z"
    assert pypi["lastSeen"] == "2026-12-02T10:09:00Z"
    # The agent's and the custodian's decisions on one host stay apart.
    both = merge_replicas([_answer(_host("github.com"), _host("github.com", identity="custodian"))])
    assert len(both[("team", "s1")]) == 2


def test_the_status_lists_twenty_destinations_denied_first_and_counts_the_rest() -> None:
    hosts = [_host(f"h{i}.example", count=i + 1) for i in range(25)]
    hosts.append(_host("blocked.example", "denied", reason="not allowed"))
    egress = summary(hosts, "2026-12-02T10:10:00Z")
    assert egress["hosts"][0]["host"] == "blocked.example"
    assert egress["hosts"][1]["host"] == "h24.example"  # then the busiest
    assert len(egress["hosts"]) == 20 and egress["moreHosts"] == 6
    assert egress["allowed"] == sum(range(1, 26)) and egress["denied"] == 1
    # The API's own model takes it as written.
    status = SessionStatus.model_validate({"egress": egress})
    assert status.egress is not None and status.egress.more_hosts == 6


def test_a_summary_that_differs_only_in_its_time_writes_nothing() -> None:
    first = summary([_host("pypi.org")], "2026-12-02T10:00:00Z")
    status = with_egress({"phase": "Running"}, first)
    assert status["egress"] == first
    later = summary([_host("pypi.org")], "2026-12-02T10:00:10Z")
    assert with_egress(status, later) is status
    more = summary([_host("pypi.org", count=2)], "2026-12-02T10:00:20Z")
    assert with_egress(status, more)["egress"]["allowed"] == 2
    assert with_egress(status, None) is status


def test_each_denied_destination_is_told_once_and_not_again_after_a_restart() -> None:
    told: set[Any] = set()
    denied = _host("evil.example", "denied", reason='evil.example:443 is not allowed for agent "a"')
    (event,) = denial_events([_host("pypi.org"), denied], told, None)
    assert (event.type, event.reason) == ("Warning", "EgressDenied")
    assert "The agent's connection to evil.example:443 was refused" in event.message
    assert "is not allowed" in event.message
    assert denial_events([denied], told, None) == []
    # A restarted operator: the status already showed what was denied before it was read.
    assert denial_events([denied], set(), "2026-12-02T10:00:00Z") == []
    newer = {**denied, "firstSeen": "2026-12-02T10:00:01Z"}
    assert len(denial_events([newer], set(), "2026-12-02T10:00:00Z")) == 1


def test_the_records_tell_only_the_sessions_whose_loops_watch_them() -> None:
    records = EgressRecords()
    body = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": "s1", "namespace": "team", "uid": "u1"},
    }
    records.watch(body)
    merged = merge_replicas(
        [
            _answer(_host("evil.example", "denied")),
            _answer(_host("other.example", "denied"), session="s2"),
        ]
    )
    changed, events = records.update(merged, "2026-12-02T10:00:30Z")
    assert sorted(changed) == [("team", "s1"), ("team", "s2")]
    assert [(ref["metadata"]["uid"], e.reason) for ref, e in events] == [("u1", "EgressDenied")]
    assert records.summary_for("team", "s2") is not None  # its status still shows it
    # The same records again: nothing changed, nothing told.
    assert records.update(merged, "2026-12-02T10:00:40Z") == ([], [])
    # No replica mentions them any more: the watched Session keeps its last records, the
    # other goes (the operator's memory follows the gateways' and its own Sessions).
    records.update({}, "2026-12-02T10:00:50Z")
    assert records.summary_for("team", "s1") is not None
    assert records.summary_for("team", "s2") is None


def test_an_ended_session_looks_once_more_after_the_gateways_next_poll() -> None:
    from datetime import UTC, datetime, timedelta

    from corral_operator.session.loop import EGRESS_SETTLE_SECONDS, _egress_settling

    ended = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
    status: dict[str, Any] = {"phase": "Succeeded", "finishedAt": "2026-12-02T10:00:00Z"}
    assert _egress_settling(status, ended + timedelta(seconds=1)) == EGRESS_SETTLE_SECONDS
    # Bounded: a Session the gateway has no records of stops looking.
    assert _egress_settling(status, ended + timedelta(seconds=60)) is None
    # Records read after the end: nothing left to wait for.
    read = {**status, "egress": {"observedAt": "2026-12-02T10:00:05Z"}}
    assert _egress_settling(read, ended + timedelta(seconds=6)) is None
    assert _egress_settling({"phase": "Running"}, ended) is None


def test_a_denial_event_names_its_session_as_kubectl_describe_finds_it() -> None:
    from corral_operator.egressrecords import event_manifest
    from corral_operator.planning.session import PlannedEvent

    ref = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": "s1", "namespace": "team", "uid": "u1"},
    }
    event = PlannedEvent("Warning", "EgressDenied", "The agent's connection to x:443 was refused")
    manifest = event_manifest(ref, event, "2026-12-02T10:00:00Z")
    assert manifest["metadata"] == {"generateName": "s1.", "namespace": "team"}
    assert manifest["involvedObject"] == {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "name": "s1",
        "namespace": "team",
        "uid": "u1",
    }
    assert (manifest["type"], manifest["reason"]) == ("Warning", "EgressDenied")
