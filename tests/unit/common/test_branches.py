"""The branch-pattern matcher shared by the operator, the custodian and `corral run`."""

from __future__ import annotations

import pytest

from corral_api.kinds import DEFAULT_SESSION_BRANCHES, AgentSpec
from corral_common.branches import (
    branch_name_problem,
    landing_target_refusal,
    matching_pattern,
    pattern_matches,
    ref_branch,
    session_branch_refusal,
)


@pytest.mark.parametrize(
    ("pattern", "branch", "matches"),
    [
        ("corral/*", "corral/a", True),
        ("corral/*", "corral/a/b", False),
        ("corral/**", "corral/a", True),
        ("corral/**", "corral/a/b", True),
        ("corral/**", "main", False),
        ("corral/**", "corral", False),
        ("corral/**", "xcorral/a", False),
        ("release-*", "release-1.2", True),
        ("release-*", "release-1/2", False),
        ("release-*", "prerelease-1", False),
        ("main", "main", True),
        ("main", "main2", False),
        ("main", "mainline", False),
        ("main", "origin/main", False),
        ("*", "main", True),
        ("*", "corral/a", False),
        ("**", "corral/a/b", True),
        ("a.b", "aXb", False),  # '.' is itself, never a regex wildcard
        ("team-*/wip", "team-a/wip", True),
        ("team-*/wip", "team-a/b/wip", False),
        ("team-**/wip", "team-a/b/wip", True),
        # Never across a refs/heads/ prefix: a full ref name matches no pattern.
        ("**", "refs/heads/main", False),
        ("corral/**", "refs/heads/corral/a", False),
        ("*/heads/**", "refs/heads/main", False),
        ("refs/heads/*", "refs/heads/main", False),
        ("refs/heads/*", "main", False),
        ("**", "HEAD", False),
    ],
)
def test_pattern_table(pattern: str, branch: str, matches: bool) -> None:
    assert pattern_matches(pattern, branch) is matches


def test_the_default_patterns_hold_the_default_session_branch_and_not_main() -> None:
    default = AgentSpec.model_validate({"identity": "i", "model": "m"}).workspace.branches
    assert default == list(DEFAULT_SESSION_BRANCHES) == ["corral/**"]
    assert matching_pattern(default, "corral/fix-bug") == "corral/**"
    assert matching_pattern(default, "corral/fix-bug-child-x7k2p") == "corral/**"
    for protected in ("main", "master", "release/1.0", "refs/heads/corral/x"):
        assert matching_pattern(default, protected) is None


@pytest.mark.parametrize(
    ("ref", "branch"),
    [
        ("main", "main"),
        ("refs/heads/main", "main"),
        ("origin/main", "main"),
        ("refs/remotes/origin/release/1", "release/1"),
        ("HEAD", None),
        ("origin/HEAD", None),
        ("0123456789abcdef0123456789abcdef01234567", None),
        ("refs/tags/v1", None),
        ("refs/pull/1/head", None),
        ("", None),
        (None, None),
    ],
)
def test_ref_branch(ref: str | None, branch: str | None) -> None:
    assert ref_branch(ref) == branch


def test_session_branch_refusals_name_the_field_the_branch_and_the_patterns() -> None:
    assert session_branch_refusal(["corral/**"], "corral/a", ref="main") is None
    outside = session_branch_refusal(["corral/**", "bot/*"], "main", agent="coder")
    assert outside is not None
    assert outside.startswith("spec.workspace.branch 'main' is outside Agent 'coder'")
    assert "(corral/**, bot/*)" in outside
    same = session_branch_refusal(["**"], "release", ref="refs/heads/release")
    assert same is not None and "spec.workspace.ref 'refs/heads/release'" in same
    # A branch the caller resolved the ref to (the remote's HEAD) counts the same.
    resolved = session_branch_refusal(["**"], "trunk", ref="HEAD", ref_branches=["trunk"])
    assert resolved is not None and "starts from" in resolved
    assert session_branch_refusal(["**"], "trunk", ref="HEAD") is None
    full = session_branch_refusal(["**"], "refs/heads/main")
    assert full is not None and "full ref name" in full
    assert session_branch_refusal([], "corral/a") is not None


def test_landing_target_refusals() -> None:
    assert landing_target_refusal(None, "main") == (
        "this Agent lists no landing targets: spec.landing.targets"
    )
    assert landing_target_refusal([], "main") is not None
    assert landing_target_refusal(["main", "release/*"], "release/2") is None
    outside = landing_target_refusal(["main", "release/*"], "prod")
    assert outside is not None and "'prod'" in outside and "(main, release/*)" in outside
    assert landing_target_refusal(["**"], "refs/heads/main") is not None


def test_branch_name_problem() -> None:
    assert branch_name_problem("corral/a") is None
    for bad in ("HEAD", "refs/heads/x", "-x", "a..b", "a//b", "a/", "x.lock", "a b", "a*"):
        assert branch_name_problem(bad) is not None, bad
