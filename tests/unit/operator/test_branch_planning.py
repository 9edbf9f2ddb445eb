"""Protected branches in the Session planner: a Session whose branch is outside its Agent's
`spec.workspace.branches` ends Failed/InvalidSpec before a pod exists; a child is held to its
own Agent's patterns, not its parent's."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from corral_operator.planning.session import plan_session
from corral_operator.settings import OperatorSettings
from tests._objects import agent_body, session_body

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
SETTINGS = OperatorSettings()


def _failed(plan: Any) -> tuple[str, str]:
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    return failed["reason"], plan.status["message"]


def _workspace(**kw: str) -> dict[str, str]:
    return {"repo": "https://git.example/repo.git", "ref": "main", **kw}


def test_a_session_on_main_with_the_default_patterns_fails_before_a_pod_exists() -> None:
    plan = plan_session(
        session_body(workspace=_workspace(branch="main")), agent_body(), None, SETTINGS, NOW
    )
    assert plan.status["phase"] == "Failed"
    reason, message = _failed(plan)
    assert reason == "InvalidSpec"
    assert "spec.workspace.branch 'main'" in message
    assert "corral/**" in message and "'coder'" in message
    assert not plan.create_sandbox
    assert plan.events[-1].type == "Warning"


def test_the_default_session_branch_matches_the_default_patterns() -> None:
    plan = plan_session(session_body(), agent_body(), None, SETTINGS, NOW)
    assert plan.create_sandbox, plan.status
    named = plan_session(
        session_body(workspace=_workspace(branch="corral/topic/x")),
        agent_body(),
        None,
        SETTINGS,
        NOW,
    )
    assert named.create_sandbox, named.status


def test_an_unset_branch_outside_the_agents_patterns_names_the_default() -> None:
    only_feature = agent_body(workspace={"branches": ["feature/*"]})
    plan = plan_session(session_body(), only_feature, None, SETTINGS, NOW)
    reason, message = _failed(plan)
    assert reason == "InvalidSpec"
    assert "'corral/fix-bug' is outside" in message and "feature/*" in message
    assert "spec.workspace.branch is unset, so the default corral/fix-bug applies" in message


@pytest.mark.parametrize(
    ("patterns", "branch", "allowed"),
    [
        (["feature/*"], "feature/a", True),
        (["feature/*"], "feature/a/b", False),
        (["feature/**"], "feature/a/b", True),
        (["release-*", "hotfix"], "hotfix", True),
        (["release-*", "hotfix"], "release-2", True),
        (["release-*", "hotfix"], "main", False),
    ],
)
def test_the_agents_patterns_decide(patterns: list[str], branch: str, allowed: bool) -> None:
    plan = plan_session(
        session_body(workspace=_workspace(branch=branch)),
        agent_body(workspace={"branches": patterns}),
        None,
        SETTINGS,
        NOW,
    )
    assert plan.create_sandbox is allowed, plan.status
    if not allowed:
        assert _failed(plan)[0] == "InvalidSpec"


@pytest.mark.parametrize("ref", ["release", "refs/heads/release", "origin/release"])
def test_the_branch_the_ref_names_is_never_the_session_branch(ref: str) -> None:
    plan = plan_session(
        session_body(workspace=_workspace(ref=ref, branch="release")),
        agent_body(workspace={"branches": ["**"]}),
        None,
        SETTINGS,
        NOW,
    )
    reason, message = _failed(plan)
    assert reason == "InvalidSpec"
    assert f"is the branch spec.workspace.ref {ref!r} names" in message
    assert not plan.create_sandbox


def test_a_read_only_session_pushes_nothing_so_has_no_branch_to_check() -> None:
    plan = plan_session(
        session_body(readOnly=True),
        agent_body(workspace={"branches": ["feature/*"]}),
        None,
        SETTINGS,
        NOW,
    )
    assert plan.create_sandbox, plan.status


PARENT_UID = "boss-uid"


def _parent() -> dict[str, Any]:
    body = session_body("boss", PARENT_UID, agentRef="lead")
    body["status"] = {"phase": "Running", "turns": 0}
    return body


def _child(agent_ref: str) -> dict[str, Any]:
    return session_body(
        "boss-child-1",
        "child-uid",
        agentRef=agent_ref,
        parentRef={"name": "boss", "uid": PARENT_UID},
    )


def test_a_child_is_held_to_its_own_agents_patterns_not_its_parents() -> None:
    # The parent's Agent allows everything under corral/; the child's own Agent does not
    # allow the child's default branch, so the child fails although its parent would pass.
    lead = agent_body("lead", orchestrator=True, children={"agents": ["narrow"]})
    narrow = agent_body("narrow", workspace={"branches": ["review/*"]})
    plan = plan_session(
        _child("narrow"), narrow, None, SETTINGS, NOW,
        parents=[_parent()], ancestor_agents={"lead": lead},
    )  # fmt: skip
    reason, message = _failed(plan)
    assert reason == "InvalidSpec"
    assert "Agent 'narrow'" in message and "review/*" in message
    assert "corral/boss-child-1" in message
    assert not plan.create_sandbox


def test_a_child_whose_own_agent_allows_its_branch_runs() -> None:
    # The parent's Agent is narrower than the child's: the child's own patterns count.
    lead = agent_body(
        "lead", orchestrator=True, children={"agents": ["coder"]},
        workspace={"branches": ["lead/*"]},
    )  # fmt: skip
    plan = plan_session(
        _child("coder"), agent_body(), None, SETTINGS, NOW,
        parents=[_parent()], ancestor_agents={"lead": lead},
    )  # fmt: skip
    assert plan.create_sandbox, plan.status
