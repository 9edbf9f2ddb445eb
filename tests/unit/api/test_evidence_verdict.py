"""verdict_for: only Evidence for exactly this check, revision, repository and definition counts,
and among those the newest finished verdict wins."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from corral_api.digest import check_definition_digest
from corral_api.evidence import evidence_counts, verdict_for
from corral_api.labels import evidence_labels

REPO = "https://git.example/team/repo.git"
REV = "0123456789abcdef0123456789abcdef01234567"
OTHER_REV = "f" * 40
COMMAND, IMAGE = "make test", "ghcr.io/x/check:1"
DIGEST = check_definition_digest(COMMAND, IMAGE)


def _ev(
    verdict: str | None = None,
    finished: str | None = None,
    *,
    check: str = "unit",
    revision: str = REV,
    repo: str = REPO,
    command: str = COMMAND,
    image: str | None = IMAGE,
    digest: str | None = DIGEST,
    labels: dict[str, str] | None = None,
    namespace: str = "team-a",
    name: str = "ev",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "repo": repo,
        "revision": revision,
        "check": check,
        "command": command,
        "definitionDigest": digest,
    }
    if image is not None:
        spec["image"] = image
    status: dict[str, Any] = {}
    if verdict is not None:
        status["verdict"] = verdict
    if finished is not None:
        status["finished"] = finished
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": evidence_labels(check, revision, repo) if labels is None else labels,
        },
        "spec": spec,
        "status": status,
    }


def _verdict(evidences: list[dict[str, Any]], digest: str = DIGEST) -> str:
    return verdict_for(evidences, "unit", REV, REPO, digest)


def test_no_evidence_is_missing() -> None:
    assert _verdict([]) == "Missing"


def test_unfinished_evidence_is_pending() -> None:
    assert _verdict([_ev()]) == "Pending"
    assert _verdict([_ev("Pending")]) == "Pending"
    # A final verdict without a finishing time is not yet a verdict.
    assert _verdict([_ev("Pass")]) == "Pending"


def test_a_finished_verdict_counts() -> None:
    for verdict in ("Pass", "Fail", "Error"):
        assert _verdict([_ev(verdict, "2026-01-01T00:00:00Z")]) == verdict


def test_the_newest_finished_verdict_wins() -> None:
    old_fail = _ev("Fail", "2026-01-01T00:00:00Z", name="a")
    new_pass = _ev("Pass", "2026-01-01T00:05:00Z", name="b")
    running = _ev("Pending", name="c")
    assert _verdict([old_fail, new_pass, running]) == "Pass"
    assert _verdict([new_pass, _ev("Error", "2026-01-02T00:00:00+00:00")]) == "Error"
    # Times compare as instants, not as strings.
    later_pass = _ev("Pass", "2026-01-01T10:00:00Z")
    earlier_fail = _ev("Fail", "2026-01-01T11:30:00+02:00")  # 09:30Z
    assert _verdict([later_pass, earlier_fail]) == "Pass"


def test_at_the_same_instant_the_cautious_verdict_wins() -> None:
    at = "2026-01-01T00:00:00Z"
    assert _verdict([_ev("Pass", at), _ev("Fail", at)]) == "Fail"
    assert _verdict([_ev("Fail", at), _ev("Error", at), _ev("Pass", at)]) == "Error"


def test_a_verdict_for_another_definition_does_not_count() -> None:
    at = "2026-01-01T00:00:00Z"
    other = check_definition_digest("true", IMAGE)
    # A Pass for another command: the digest it carries is not the one asked for.
    assert _verdict([_ev("Pass", at, command="true", digest=other)]) == "Missing"
    # The same, for another image.
    other_image = check_definition_digest(COMMAND, "alpine")
    assert _verdict([_ev("Pass", at, image="alpine", digest=other_image)]) == "Missing"
    # A digest that is not the digest of the command it ran never counts, even if asked for.
    assert _verdict([_ev("Pass", at, command="true", digest=DIGEST)]) == "Missing"
    # No digest at all: bound to nothing.
    assert _verdict([_ev("Pass", at, digest=None)]) == "Missing"
    # The real one still counts beside them.
    assert _verdict([_ev("Pass", at, command="true", digest=other), _ev("Fail", at)]) == "Fail"


def test_evidence_for_another_check_revision_or_repo_does_not_count() -> None:
    at = "2026-01-01T00:00:00Z"
    assert _verdict([_ev("Pass", at, check="lint")]) == "Missing"
    assert _verdict([_ev("Pass", at, revision=OTHER_REV)]) == "Missing"
    assert _verdict([_ev("Pass", at, repo="https://git.example/fork.git")]) == "Missing"


def test_labels_and_spec_must_both_match() -> None:
    at = "2026-01-01T00:00:00Z"
    # Labels relabelled onto another revision's Evidence: the spec still says the other one.
    relabelled = _ev("Pass", at, revision=OTHER_REV, labels=evidence_labels("unit", REV, REPO))
    assert _verdict([relabelled]) == "Missing"
    # The right spec without the labels CI selects by.
    assert _verdict([_ev("Pass", at, labels={})]) == "Missing"


def test_namespace_is_checked_when_given() -> None:
    ev = _ev("Pass", "2026-01-01T00:00:00Z", namespace="team-b")
    assert verdict_for([ev], "unit", REV, REPO, DIGEST) == "Pass"
    assert verdict_for([ev], "unit", REV, REPO, DIGEST, namespace="team-a") == "Missing"


def test_malformed_objects_never_count() -> None:
    broken: list[dict[str, Any]] = [
        {},
        {"metadata": None, "spec": None},
        {"metadata": {"labels": evidence_labels("unit", REV, REPO)}, "spec": {"command": 3}},
        _ev("Pass", "not a time"),
    ]
    assert _verdict(broken) in ("Missing", "Pending")
    assert not any(evidence_counts(e, "unit", REV, REPO, DIGEST) for e in broken[:3])


# ------------------------------------------------------------------------------- properties

_times = st.integers(min_value=0, max_value=10_000)
_ORDER = ("Pass", "Fail", "Error")
_final = st.sampled_from(_ORDER)


def _at(minute: int) -> str:
    return f"2026-01-{1 + minute // 1440:02d}T{minute // 60 % 24:02d}:{minute % 60:02d}:00Z"


_record = st.tuples(
    st.sampled_from(["Pass", "Fail", "Error", "Pending", None]),
    _times,
    st.booleans(),  # bound to the asked-for definition?
)


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(st.lists(_record, max_size=12))
def test_property_the_verdict_is_the_newest_finished_of_those_that_count(
    records: list[tuple[str | None, int, bool]],
) -> None:
    other = check_definition_digest("other command", IMAGE)
    evidences = [
        _ev(v, _at(t) if v not in (None, "Pending") else None, name=f"e{i}")
        if bound
        else _ev(v, _at(t), command="other command", digest=other, name=f"e{i}")
        for i, (v, t, bound) in enumerate(records)
    ]
    counting = [(v, t) for v, t, bound in records if bound]
    finished = [(t, {"Pass": 0, "Fail": 1, "Error": 2}[v], v) for v, t in counting if v in _ORDER]
    expected = max(finished)[2] if finished else ("Pending" if counting else "Missing")
    assert _verdict(evidences) == expected
    # Order of the list never matters.
    assert _verdict(list(reversed(evidences))) == expected


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(st.lists(st.tuples(_final, _times), min_size=1, max_size=8), _final, _times)
def test_property_a_foreign_definition_never_changes_the_verdict(
    own: list[tuple[str, int]], foreign_verdict: str, foreign_time: int
) -> None:
    evidences = [_ev(v, _at(t), name=f"e{i}") for i, (v, t) in enumerate(own)]
    before = _verdict(evidences)
    other = check_definition_digest(COMMAND, "another-image")
    foreign = _ev(foreign_verdict, _at(foreign_time), image="another-image", digest=other)
    assert _verdict([*evidences, foreign]) == before
    # And asked about the other definition, only the foreign one counts.
    assert _verdict([*evidences, foreign], digest=other) == foreign_verdict
