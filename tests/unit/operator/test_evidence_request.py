"""Which Evidence the operator creates for a landing Approval, what it looks like, and that a
second trigger for the same check, revision, repository and definition creates nothing."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral_api.digest import check_definition_digest
from corral_api.evidence import verdict_for
from corral_api.kinds import Evidence, LandingCheck
from corral_api.labels import EVIDENCE_SESSION, evidence_labels
from corral_operator.planning.approval import evidence_requested
from corral_operator.planning.evidence_request import (
    EvidenceWanted,
    build_evidence,
    effective_landing_check,
    evidence_name,
    landing_revision,
    plan_evidence_creation,
    session_needs_agent,
    wanted_for_approval,
)
from tests._objects import SESSION_UID, approval

NS = "team-a"
REPO = "https://git.example/team/repo.git"
REV = "0123456789abcdef0123456789abcdef01234567"
CHECK = {
    "name": "unit",
    "command": "make test",
    "image": "ghcr.io/x/check:1",
    "egress": [{"cidr": "10.0.0.0/8", "ports": [443]}],
}
DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _session(check: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "agentRef": "coder",
        "task": "t",
        "workspace": {"repo": REPO, "ref": "main"},
    }
    if check is not None:
        spec["landing"] = {"check": check}
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": "fix-bug", "namespace": NS, "uid": SESSION_UID, **meta},
        "spec": spec,
    }


def _agent(check: dict[str, Any] | None = None, name: str = "coder") -> dict[str, Any]:
    spec: dict[str, Any] = {"identity": "x", "model": "m"}
    if check is not None:
        spec["landing"] = {"check": check}
    return {"metadata": {"name": name, "namespace": NS}, "spec": spec}


def _approval(tool: str = "land", arguments: Any = None, **kw: Any) -> dict[str, Any]:
    """fix-bug's Approval of a `tool` call in NS: land's at REV unless `arguments` say otherwise
    (`kw`: uid, decision, digest)."""
    return approval(
        "fix-bug-land-x1", namespace=NS, tool=tool, arguments=arguments, revision=REV, **kw
    )


def _wanted(**kw: Any) -> EvidenceWanted:
    base: dict[str, Any] = {
        "namespace": NS,
        "check": LandingCheck.model_validate(CHECK),
        "repo": REPO,
        "revision": REV,
        "session_name": "fix-bug",
        "session_uid": SESSION_UID,
    }
    base.update(kw)
    return EvidenceWanted(**base)


# --------------------------------------------------------------------------------- builder


def test_the_evidence_is_bound_to_the_revision_and_the_definition() -> None:
    ev = build_evidence(_wanted(requested_by="Approval/a1"))
    digest = check_definition_digest("make test", "ghcr.io/x/check:1")
    assert ev["spec"] == {
        "repo": REPO,
        "revision": REV,
        "check": "unit",
        "command": "make test",
        "image": "ghcr.io/x/check:1",
        "definitionDigest": digest,
        "egress": [{"cidr": "10.0.0.0/8", "ports": [443], "methods": []}],
    }
    labels = ev["metadata"]["labels"]
    assert evidence_labels("unit", REV, REPO).items() <= labels.items()
    assert labels[EVIDENCE_SESSION] == "fix-bug"
    assert ev["metadata"]["namespace"] == NS
    assert "ownerReferences" not in ev["metadata"]  # a verdict outlives its Session
    assert ev["metadata"]["annotations"] == {"corral.dev/requested-by": "Approval/a1"}
    # It is a valid Evidence, and the verdict helper counts it once it is finished.
    Evidence.model_validate(ev)
    done = {**ev, "status": {"verdict": "Pass", "finished": "2026-01-01T00:00:00Z"}}
    assert verdict_for([done], "unit", REV, REPO, digest) == "Pass"


def test_without_a_session_there_is_no_owner_and_no_session_label() -> None:
    ev = build_evidence(_wanted(session_name=None, session_uid=None))
    assert "ownerReferences" not in ev["metadata"]
    assert EVIDENCE_SESSION not in ev["metadata"]["labels"]


def test_a_check_without_image_or_egress() -> None:
    check = LandingCheck.model_validate({"name": "unit", "command": "true"})
    ev = build_evidence(_wanted(check=check))
    assert "image" not in ev["spec"] and ev["spec"]["egress"] == []
    assert ev["spec"]["definitionDigest"] == check_definition_digest("true", None)


def test_the_name_is_deterministic_and_dns_safe() -> None:
    digest = check_definition_digest("make test", None)
    name = evidence_name("unit", REV, REPO, digest)
    assert name == evidence_name("unit", REV, REPO, digest)
    assert name.startswith(f"unit-{REV[:12]}-")
    assert DNS_NAME.match(name) and len(name) <= 63
    # Another repository, another definition or another check: another name.
    assert name != evidence_name("unit", REV, "https://git.example/fork.git", digest)
    assert name != evidence_name("unit", REV, REPO, check_definition_digest("make", None))
    assert name != evidence_name("unit2", REV, REPO, digest)


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True),
    st.from_regex(r"[0-9a-f]{40}", fullmatch=True),
    st.text(min_size=1, max_size=200),
)
def test_property_names_are_dns_labels(check: str, revision: str, repo: str) -> None:
    name = evidence_name(check, revision, repo, check_definition_digest("c", None))
    assert DNS_NAME.match(name) and len(name) <= 63


# ------------------------------------------------------------------------------ idempotence


def test_a_second_trigger_creates_nothing() -> None:
    first = plan_evidence_creation(_wanted(), [])
    assert first is not None
    stored = {**first, "metadata": {**first["metadata"], "uid": "ev-uid"}}
    assert plan_evidence_creation(_wanted(), [stored]) is None
    # Finished or not, whatever its verdict: one Evidence per (check, revision, repo, digest).
    finished = {**stored, "status": {"verdict": "Fail", "finished": "2026-01-01T00:00:00Z"}}
    assert plan_evidence_creation(_wanted(), [finished]) is None
    # From another trigger (no session) it is the same Evidence.
    assert plan_evidence_creation(_wanted(session_name=None, session_uid=None), [stored]) is None


def test_another_definition_revision_repo_or_namespace_is_created() -> None:
    stored = build_evidence(_wanted())
    other_check = LandingCheck.model_validate({**CHECK, "command": "make check"})
    assert plan_evidence_creation(_wanted(check=other_check), [stored]) is not None
    assert plan_evidence_creation(_wanted(revision="f" * 40), [stored]) is not None
    assert plan_evidence_creation(_wanted(repo="https://git.example/fork.git"), [stored])
    assert plan_evidence_creation(_wanted(namespace="team-b"), [stored]) is not None


def test_an_evidence_with_a_forged_digest_does_not_satisfy_the_trigger() -> None:
    forged = build_evidence(_wanted())
    forged["spec"]["command"] = "true"  # the digest no longer describes what it runs
    assert plan_evidence_creation(_wanted(), [forged]) is not None


# -------------------------------------------------------------------------------- triggers


def test_the_session_check_wins_over_the_agent_check() -> None:
    own = {**CHECK, "name": "own"}
    assert effective_landing_check(_session(own), _agent(CHECK)) == LandingCheck.model_validate(own)
    assert effective_landing_check(_session(), _agent(CHECK)) == LandingCheck.model_validate(CHECK)
    assert effective_landing_check(_session(), _agent()) is None
    assert effective_landing_check(_session(), None) is None
    assert session_needs_agent(_session()) and not session_needs_agent(_session(own))


def test_a_pending_land_approval_wants_the_sessions_check_at_its_revision() -> None:
    wanted = wanted_for_approval(_approval(), _session(CHECK), None)
    assert wanted is not None
    assert (wanted.namespace, wanted.revision, wanted.repo) == (NS, REV, REPO)
    assert wanted.check.name == "unit" and wanted.session_uid == SESSION_UID
    assert wanted.requested_by == "Approval/fix-bug-land-x1"
    # The Agent's check when the Session has none; merge counts like land.
    from_agent = wanted_for_approval(_approval("merge"), _session(), _agent(CHECK))
    assert from_agent is not None and from_agent.check.name == "unit"
    # An approved one still needs its Evidence (the operator may have been down).
    assert wanted_for_approval(_approval(decision="Approved"), _session(CHECK), None)
    event = evidence_requested(build_evidence(wanted))
    assert event.reason == "EvidenceRequested" and REV[:12] in event.message


@pytest.mark.parametrize(
    ("approval", "session", "agent"),
    [
        pytest.param(_approval("push"), _session(CHECK), None, id="not-a-landing-tool"),
        pytest.param(_approval(decision="Denied"), _session(CHECK), None, id="denied"),
        pytest.param(_approval(), _session(), None, id="no-check-anywhere"),
        pytest.param(_approval(), _session(), _agent(), id="agent-without-check"),
        pytest.param(_approval(), _session(), _agent(CHECK, "other"), id="someone-elses-agent"),
        pytest.param(_approval(), None, None, id="no-session"),
        pytest.param(_approval(uid="other-uid"), _session(CHECK), None, id="other-session-uid"),
        pytest.param(
            _approval(),
            _session(CHECK, deletionTimestamp="2026-01-01T00:00:00Z"),
            None,
            id="session-going",
        ),
        pytest.param(
            _approval(arguments={"target": "main"}), _session(CHECK), None, id="no-revision"
        ),
        pytest.param(
            _approval(arguments={"revision": "abc123", "target": "main"}),
            _session(CHECK),
            None,
            id="short-revision",
        ),
        pytest.param(
            _approval(arguments=["not", "an", "object"]), _session(CHECK), None, id="not-object"
        ),
        pytest.param(
            _approval(digest="sha256:" + "0" * 64), _session(CHECK), None, id="digest-mismatch"
        ),
    ],
)
def test_no_evidence_is_wanted(
    approval: dict[str, Any], session: dict[str, Any] | None, agent: dict[str, Any] | None
) -> None:
    assert wanted_for_approval(approval, session, agent) is None


def test_landing_revision_reads_the_custodians_land_request() -> None:
    # Exactly what the custodian's approval_manifest writes for a land call.
    body = _approval()
    assert json.loads(body["spec"]["action"]["arguments"]) == {"revision": REV, "target": "main"}
    assert landing_revision(body) == REV
    unparsable = _approval()
    unparsable["spec"]["action"]["arguments"] = "{not json"
    assert landing_revision(unparsable) is None


def test_an_approval_in_another_namespace_than_its_session_wants_nothing() -> None:
    session = _session(CHECK)
    session["metadata"]["namespace"] = "team-b"
    assert wanted_for_approval(_approval(), session, None) is None
