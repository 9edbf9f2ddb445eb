"""The custodian's rules, attacked the way a model (or the agent's shell) would attack them."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from corral_api.digest import check_definition_digest
from corral_api.kinds import (
    AgentLimits,
    AgentSpec,
    AgentWorkspace,
    ChildPolicy,
    Landing,
    LandingCheck,
    ToolPolicy,
)
from corral_api.labels import evidence_labels
from corral_custodian import rules
from corral_custodian._digest import action_digest, canonical_json
from corral_custodian.budget import Remaining
from corral_custodian.facts import SessionFacts
from corral_custodian.menu import menu, why_not_offered

SHA = "a" * 40
OTHER_SHA = "b" * 40


ALL_TOOLS = ToolPolicy(allow=["*"])


def agent(**limits: int) -> AgentSpec:
    return AgentSpec(
        identity="you orchestrate",
        model="claude-haiku-4-5",
        orchestrator=True,
        limits=AgentLimits(**limits),
        tools=ALL_TOOLS,
        landing=Landing(targets=["main"]),
    )


def facts(**overrides: Any) -> SessionFacts:
    base = SessionFacts(
        name="parent",
        namespace="team-a",
        uid="uid-parent",
        agent=agent(max_turns=10),
        agent_ref="coder",
        depth=0,
        turns_used=2,
        branch="corral/parent",
        cluster=True,
    )
    return replace(base, **overrides)


def refused(result: object, *fragments: str) -> str:
    assert isinstance(result, rules.Refusal), f"expected a refusal, got {result!r}"
    for fragment in fragments:
        assert fragment in result.reason
    return result.reason


# ------------------------------------------------------------------------------------ spawn


def test_spawn_gives_the_child_depth_plus_one_and_the_parents_workspace() -> None:
    plan = rules.decide_spawn(facts(depth=1), {"task": "write tests"}, children_this_turn=0)
    assert isinstance(plan, rules.ChildPlan)
    assert plan.depth == 2
    assert plan.agent_ref == "coder"
    manifest = rules.child_session_manifest(
        facts(depth=1),
        plan,
        {"workspace": {"repo": "https://git/x", "ref": "main", "branch": "corral/parent"}},
        "turn-2",
    )
    assert manifest["spec"]["parentRef"] == {"name": "parent", "uid": "uid-parent"}
    owner = manifest["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Session", "parent", "uid-parent")
    # The child gets the parent's checkout but not its branch: it cannot push the parent's work.
    assert manifest["spec"]["workspace"] == {"repo": "https://git/x", "ref": "main"}
    assert manifest["metadata"]["labels"]["corral.dev/depth"] == "2"


def test_a_model_asking_for_depth_4_is_refused_at_the_cap() -> None:
    # The session is at depth 3 (the hard cap); the model tries to push the limit in the input.
    reason = refused(
        rules.decide_spawn(
            facts(depth=3), {"task": "go deeper", "depth": 0, "maxDepth": 9}, children_this_turn=0
        ),
        "depth 4",
    )
    assert "limit of 3" in reason


def test_an_agent_cannot_configure_depth_above_the_cap() -> None:
    with pytest.raises(ValueError):
        AgentLimits(max_depth=4)


def test_an_agent_with_a_lower_depth_limit_is_held_to_it() -> None:
    f = facts(agent=agent(max_depth=1), depth=1)
    refused(rules.decide_spawn(f, {"task": "t"}, children_this_turn=0), "depth 2", "limit of 1")


def test_cap_like_fields_in_the_input_are_ignored_and_reported() -> None:
    plan = rules.decide_spawn(
        facts(),
        {"task": "t", "maxChildrenPerTurn": 99, "depth": -5, "maxDepth": 10},
        children_this_turn=0,
    )
    assert isinstance(plan, rules.ChildPlan)
    assert plan.depth == 1
    assert plan.ignored == ("depth", "maxChildrenPerTurn", "maxDepth")


def test_a_sixth_child_in_one_turn_is_refused() -> None:
    for started in range(5):
        assert isinstance(rules.decide_spawn(facts(), {"task": "t"}, started), rules.ChildPlan)
    refused(
        rules.decide_spawn(facts(), {"task": "t", "maxChildrenPerTurn": 50}, 5),
        "5 of 5 children",
    )


def test_the_agents_lower_fan_out_limit_applies() -> None:
    f = facts(agent=agent(max_children_per_turn=2, max_turns=10))
    refused(rules.decide_spawn(f, {"task": "t"}, 2), "2 of 2")


def test_a_child_never_gets_more_turns_than_the_parent_has_left() -> None:
    # 10 turns, 7 settled: the parent has 3 left, counting the one in progress.
    f = facts(turns_used=7)
    plan = rules.decide_spawn(f, {"task": "t", "maxTurns": 500}, 0)
    assert isinstance(plan, rules.ChildPlan)
    assert plan.max_turns == 3
    smaller = rules.decide_spawn(f, {"task": "t", "maxTurns": 2}, 0)
    assert isinstance(smaller, rules.ChildPlan) and smaller.max_turns == 2


def test_a_parent_with_no_turns_left_cannot_spawn() -> None:
    refused(rules.decide_spawn(facts(turns_used=10), {"task": "t"}, 0), "no turns left")


def test_a_leaf_agent_cannot_spawn() -> None:
    leaf = AgentSpec(identity="leaf", model="claude-haiku-4-5", tools=ALL_TOOLS)
    refused(rules.decide_spawn(facts(agent=leaf), {"task": "t"}, 0), "orchestrator")


def test_a_read_only_parent_cannot_make_a_writing_child() -> None:
    plan = rules.decide_spawn(facts(read_only=True), {"task": "t", "readOnly": False}, 0)
    assert isinstance(plan, rules.ChildPlan) and plan.read_only is True


@pytest.mark.parametrize(
    ("tool_input", "fragment"),
    [
        ({}, "'task'"),
        ({"task": "  "}, "'task'"),
        ({"task": "t", "agent": "Not_A_Label"}, "'agent'"),
        ({"task": "t", "maxTurns": 0}, "'maxTurns'"),
        ({"task": "t", "maxTurns": True}, "'maxTurns'"),
        ({"task": "t", "readOnly": "yes"}, "'readOnly'"),
    ],
)
def test_bad_spawn_input_gets_a_clear_reason(tool_input: dict[str, Any], fragment: str) -> None:
    refused(rules.decide_spawn(facts(), tool_input, 0), fragment)


def test_a_child_runs_under_the_parents_agent_unless_the_agent_lists_others() -> None:
    plan = rules.decide_spawn(facts(), {"task": "t", "agent": "coder"}, 0)
    assert isinstance(plan, rules.ChildPlan) and plan.agent_ref == "coder"
    reason = refused(
        rules.decide_spawn(facts(), {"task": "t", "agent": "admin"}, 0), "spec.children.agents"
    )
    assert "'admin'" in reason and "listed: none" in reason
    lists = facts().agent.model_copy(
        update={"children": ChildPolicy(agents=["reviewer", "tester"])}
    )
    plan = rules.decide_spawn(facts(agent=lists), {"task": "t", "agent": "tester"}, 0)
    assert isinstance(plan, rules.ChildPlan) and plan.agent_ref == "tester"
    refused(
        rules.decide_spawn(facts(agent=lists), {"task": "t", "agent": "admin"}, 0),
        "listed: reviewer, tester",
    )


def test_a_childs_budget_is_carved_from_what_the_parent_has_left() -> None:
    left = Remaining(tokens=10_000, cost=2.0)
    asked = rules.decide_spawn(
        facts(), {"task": "t", "budget": {"tokens": 50_000, "costUSD": 0.5}}, 0, left
    )
    assert isinstance(asked, rules.ChildPlan)
    # min(requested, remaining) on each axis
    assert asked.budget == rules.ChildBudget(tokens=10_000, cost=0.5)
    assert asked.budget.carved.tokens == 10_000
    manifest = rules.child_session_manifest(facts(), asked, {}, "turn-1")
    assert manifest["spec"]["budget"] == {"tokens": 10_000, "costUSD": 0.5}
    # Asked for nothing: half of what is left, so the parent can still read the answer.
    default = rules.decide_spawn(facts(), {"task": "t"}, 0, left)
    assert isinstance(default, rules.ChildPlan)
    assert default.budget == rules.ChildBudget(tokens=5_000, cost=1.0)
    # An uncapped parent hands on only what was asked for.
    free = rules.decide_spawn(facts(), {"task": "t", "budget": {"tokens": 7}}, 0)
    assert isinstance(free, rules.ChildPlan) and free.budget == rules.ChildBudget(tokens=7)
    plain = rules.decide_spawn(facts(), {"task": "t"}, 0)
    assert isinstance(plain, rules.ChildPlan)
    assert "budget" not in rules.child_session_manifest(facts(), plain, {}, "t")["spec"]
    refused(
        rules.decide_spawn(facts(), {"task": "t"}, 0, Remaining(tokens=0, cost=None)),
        "no token budget left",
    )
    refused(
        rules.decide_spawn(facts(), {"task": "t"}, 0, Remaining(tokens=None, cost=0.0)),
        "no cost budget left",
    )
    for bad in ({"tokens": 0}, {"tokens": "9"}, {"costUSD": -1}, {"dollars": 5}, 3):
        refused(rules.decide_spawn(facts(), {"task": "t", "budget": bad}, 0, left), "'budget")


def test_only_sessions_naming_our_uid_are_our_children() -> None:
    mine = {"metadata": {"namespace": "team-a"}, "spec": {"parentRef": {"uid": "uid-parent"}}}
    namesake = {"metadata": {"namespace": "team-a"}, "spec": {"parentRef": {"uid": "other"}}}
    elsewhere = {"metadata": {"namespace": "team-b"}, "spec": {"parentRef": {"uid": "uid-parent"}}}
    assert rules.is_own_child(facts(), mine)
    assert not rules.is_own_child(facts(), namesake)
    assert not rules.is_own_child(facts(), elsewhere)


# ------------------------------------------------------------------------------------- wait


def child(name: str, phase: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": phase}}


def test_wait_modes() -> None:
    kids = [child("a", "Succeeded"), child("b", "Running"), child("c", "Failed")]

    def satisfied(**tool_input: Any) -> bool:
        verdict = rules.decide_wait(tool_input, kids)
        assert isinstance(verdict, rules.WaitVerdict)
        return verdict.satisfied

    assert not satisfied(mode="all")
    assert satisfied(mode="first")
    assert satisfied(mode="quorum", quorum=1)
    assert not satisfied(mode="quorum", quorum=2)  # b may still succeed
    assert satisfied(mode="quorum", quorum=3)  # c failed: 3 successes can no longer happen
    assert satisfied(mode="supervise")  # a failure stops supervision
    assert not satisfied(mode="supervise", children=["a", "b"])
    assert satisfied(mode="all", children=["a", "c"])


def test_wait_refuses_bad_modes_and_strangers() -> None:
    refused(rules.decide_wait({"mode": "never"}, [child("a", "Running")]), "'mode'")
    refused(rules.decide_wait({"children": ["zzz"]}, [child("a", "Running")]), "zzz")
    refused(rules.decide_wait({}, []), "no children")
    refused(rules.decide_wait({"mode": "quorum", "quorum": 5}, [child("a", "Running")]), "1 to 1")


def test_tree_lists_descendants_only() -> None:
    def sess(name: str, uid: str, parent: str | None) -> dict[str, Any]:
        spec = {"parentRef": {"name": "?", "uid": parent}} if parent else {}
        return {
            "metadata": {"name": name, "uid": uid},
            "spec": spec,
            "status": {"phase": "Running"},
        }

    lines = rules.tree_lines(
        "p",
        "parent",
        [sess("k1", "u1", "p"), sess("g1", "u2", "u1"), sess("other", "u3", None)],
    )
    assert lines == [
        "parent (this session)",
        "  - k1: Running, 0 turns",
        "    - g1: Running, 0 turns",
    ]


# ------------------------------------------------------------------------------------- push


def test_push_targets_the_sessions_branch() -> None:
    assert rules.decide_push(facts(), {}) == rules.PushPlan("corral/parent")
    assert rules.decide_push(facts(), {"branch": "corral/parent"}) == rules.PushPlan(
        "corral/parent"
    )
    assert rules.decide_push(facts(), {"refspec": "HEAD:refs/heads/corral/parent"}) == (
        rules.PushPlan("corral/parent")
    )


@pytest.mark.parametrize(
    ("tool_input", "fragment"),
    [
        ({"branch": "main"}, "'main'"),
        ({"refspec": "HEAD:main"}, "'main'"),
        ({"refspec": "HEAD:refs/heads/main"}, "refs/heads/main"),
        ({"refspec": "+HEAD:corral/parent"}, "force"),
        ({"force": True}, "'force'"),
        ({"forceWithLease": True}, "'forceWithLease'"),
        ({"tags": True}, "'tags'"),
        ({"refspec": "HEAD:refs/tags/v1"}, "only branches"),
        ({"refspec": ":corral/parent"}, "deleting"),
        ({"delete": True}, "'delete'"),
        ({"mirror": True}, "'mirror'"),
        ({"refspec": "refs/heads/main:corral/parent"}, "source must be HEAD"),
        ({"refspec": "HEAD:corral/parent HEAD:main"}, "not a plain"),
        ({"refspec": "HEAD:refs/heads/*"}, "not a plain"),
        ({"remote": "https://evil.example/repo.git"}, "'remote'"),
    ],
)
def test_push_attacks_are_refused(tool_input: dict[str, Any], fragment: str) -> None:
    refused(rules.decide_push(facts(), tool_input), fragment)


def test_push_without_a_branch_or_in_read_only_is_refused() -> None:
    refused(rules.decide_push(facts(branch=None), {}), "no branch")
    refused(rules.decide_push(facts(read_only=True), {}), "read-only")


def test_a_session_branch_outside_the_agents_patterns_is_never_pushed() -> None:
    # The operator fails such a Session before a pod exists; the custodian refuses the same,
    # whatever the input says, as if the operator had been bypassed.
    on_main = facts(branch="main")
    for tool_input in ({}, {"branch": "main"}, {"refspec": "HEAD:refs/heads/main"}):
        refused(
            rules.decide_push(on_main, tool_input),
            "pushes nothing",
            "spec.workspace.branch 'main'",
            "Agent 'coder'",
            "corral/**",
        )
    narrow = agent().model_copy(update={"workspace": AgentWorkspace(branches=["bot/*"])})
    refused(rules.decide_push(facts(agent=narrow), {}), "'corral/parent' is outside", "bot/*")
    assert rules.decide_push(facts(agent=narrow, branch="bot/x"), {}) == rules.PushPlan("bot/x")
    assert rules.branch_refusal(facts()) is None


@pytest.mark.parametrize("ref", ["release", "refs/heads/release", "origin/release"])
def test_the_branch_the_ref_names_is_never_pushed(ref: str) -> None:
    anywhere = agent().model_copy(update={"workspace": AgentWorkspace(branches=["**"])})
    onto_base = facts(agent=anywhere, branch="release", ref=ref)
    refused(rules.decide_push(onto_base, {}), f"spec.workspace.ref {ref!r}", "starts from")
    # The remote's HEAD, resolved by the caller, counts the same.
    head = facts(agent=anywhere, branch="trunk", ref="HEAD", ref_branches=("trunk",))
    refused(rules.decide_push(head, {}), "starts from")
    assert isinstance(rules.decide_push(facts(agent=anywhere, ref="main"), {}), rules.PushPlan)


# ------------------------------------------------------------------------------------- land


def approval(
    decision: str,
    *,
    created: str = "2026-11-29T10:00:00Z",
    name_suffix: str = "1",
    tool: str = "land",
    arguments: dict[str, Any] | None = None,
    digest: str | None = None,
    namespace: str = "team-a",
    name: str = "parent",
    uid: str = "uid-parent",
) -> dict[str, Any]:
    args = arguments if arguments is not None else {"target": "main", "revision": SHA}
    return {
        "metadata": {
            "name": f"apr-{name_suffix}",
            "namespace": namespace,
            "creationTimestamp": created,
        },
        "spec": {
            "sessionRef": {"name": name, "uid": uid},
            "action": {
                "tool": tool,
                "arguments": canonical_json(args),
                "digest": digest or action_digest(tool, args),
            },
        },
        "status": {"decision": decision},
    }


LAND = {"target": "main", "revision": SHA}


def test_digest_is_sha256_of_tool_and_canonical_arguments() -> None:
    import hashlib

    expected = hashlib.sha256(b'land{"revision":"' + SHA.encode() + b'","target":"main"}')
    assert action_digest("land", {"target": "main", "revision": SHA}) == (
        "sha256:" + expected.hexdigest()
    )
    # Key order does not matter; values do.
    assert action_digest("land", {"revision": SHA, "target": "main"}) == action_digest("land", LAND)
    assert action_digest("land", {**LAND, "revision": OTHER_SHA}) != action_digest("land", LAND)


def test_land_without_approval_asks_a_human() -> None:
    decision = rules.decide_land(facts(), LAND, [], [])
    assert isinstance(decision, rules.AskApproval)
    assert decision.digest == action_digest("land", LAND)
    manifest = rules.approval_manifest(facts(), decision)
    assert manifest["spec"]["sessionRef"] == {"name": "parent", "uid": "uid-parent"}
    assert manifest["spec"]["action"]["digest"] == decision.digest
    assert json.loads(manifest["spec"]["action"]["arguments"]) == LAND


def test_land_with_a_matching_approval_lands() -> None:
    decision = rules.decide_land(facts(), LAND, [approval("Approved")], [])
    assert decision == rules.LandPlan("main", SHA, action_digest("land", LAND))


def test_land_waits_while_pending_and_the_newest_decision_counts() -> None:
    refused(rules.decide_land(facts(), LAND, [approval("Pending")], []), "awaits")
    older_yes = approval("Approved", created="2026-11-29T10:00:00Z", name_suffix="a")
    newer_no = approval("Denied", created="2026-11-29T11:00:00Z", name_suffix="b")
    refused(rules.decide_land(facts(), LAND, [older_yes, newer_no], []), "denied")
    older_no = approval("Denied", created="2026-11-29T10:00:00Z", name_suffix="c")
    newer_yes = approval("Approved", created="2026-11-29T11:00:00Z", name_suffix="d")
    assert isinstance(rules.decide_land(facts(), LAND, [newer_yes, older_no], []), rules.LandPlan)
    # A pending request does not hide an earlier approval of the same call.
    pending = approval("Pending", created="2026-11-29T12:00:00Z", name_suffix="e")
    assert isinstance(rules.decide_land(facts(), LAND, [newer_yes, pending], []), rules.LandPlan)


def test_an_approval_for_a_different_digest_does_not_count() -> None:
    # Approved for another revision: landing SHA must not ride on it.
    other = approval("Approved", arguments={"target": "main", "revision": OTHER_SHA})
    assert isinstance(rules.decide_land(facts(), LAND, [other], []), rules.AskApproval)


def test_an_approval_whose_digest_lies_about_its_arguments_does_not_count() -> None:
    # Right digest, other arguments: someone hand-wrote a digest onto a different action.
    forged = approval(
        "Approved",
        arguments={"target": "main", "revision": OTHER_SHA},
        digest=action_digest("land", LAND),
    )
    assert isinstance(rules.decide_land(facts(), LAND, [forged], []), rules.AskApproval)


def test_an_approval_of_another_session_uid_does_not_count() -> None:
    # Same name, different uid: a deleted-and-recreated session, or a namesake.
    stale = approval("Approved", uid="uid-of-an-older-parent")
    assert isinstance(rules.decide_land(facts(), LAND, [stale], []), rules.AskApproval)


def test_an_approval_from_another_namespace_or_session_does_not_count() -> None:
    for stranger in (
        approval("Approved", namespace="team-b"),
        approval("Approved", name="sibling"),
        approval("Approved", tool="push"),
    ):
        assert isinstance(rules.decide_land(facts(), LAND, [stranger], []), rules.AskApproval)


REPO = "https://git.example/team/app.git"
CHECK = LandingCheck(name="unit-tests", command="make test", image="ci:1")


def evidence(
    verdict: str,
    *,
    revision: str = SHA,
    check: LandingCheck = CHECK,
    repo: str = REPO,
    digest: str | None = None,
    finished: str = "2026-11-29T10:00:00Z",
    name: str = "ev",
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "labels": evidence_labels(check.name, revision, repo),
        },
        "spec": {
            "repo": repo,
            "revision": revision,
            "check": check.name,
            "command": check.command,
            "image": check.image,
            "definitionDigest": digest or check_definition_digest(check.command, check.image),
        },
        "status": {"verdict": verdict, **({"finished": finished} if verdict != "Pending" else {})},
    }


def test_land_needs_pass_evidence_of_the_exact_check_definition() -> None:
    f = facts(land_check=CHECK, repo=REPO)
    approved = [approval("Approved")]
    waits = refused(rules.decide_land(f, LAND, approved, []), "waits for the Evidence")
    assert "does not exist yet" in waits and "'unit-tests'" in waits
    running = refused(rules.decide_land(f, LAND, approved, [evidence("Pending")]), "waits")
    assert "still running" in running
    refused(rules.decide_land(f, LAND, approved, [evidence("Fail")]), "says Fail")
    assert isinstance(rules.decide_land(f, LAND, approved, [evidence("Pass")]), rules.LandPlan)
    # Pass Evidence that is about something else does not count.
    for stranger in (
        evidence("Pass", revision=OTHER_SHA),
        evidence("Pass", check=LandingCheck(name="lint", command="make test", image="ci:1")),
        evidence("Pass", repo="https://git.example/other.git"),
        # Same name, but it ran another command: the definition digest says so.
        evidence("Pass", digest=check_definition_digest("true", "ci:1")),
        evidence("Pass", digest=check_definition_digest("make test", None)),
    ):
        refused(rules.decide_land(f, LAND, approved, [stranger]), "does not exist yet")
    # Labels that do not match are not enough to trick it either way.
    unlabelled = evidence("Pass")
    unlabelled["metadata"]["labels"] = {}
    refused(rules.decide_land(f, LAND, approved, [unlabelled]), "waits")


def test_the_newest_finished_verdict_wins() -> None:
    f = facts(land_check=CHECK, repo=REPO)
    approved = [approval("Approved")]
    old_pass = evidence("Pass", finished="2026-11-29T10:00:00Z", name="a")
    new_fail = evidence("Fail", finished="2026-11-29T11:00:00Z", name="b")
    refused(rules.decide_land(f, LAND, approved, [old_pass, new_fail]), "says Fail")
    newer_pass = evidence("Pass", finished="2026-11-29T12:00:00Z", name="c")
    decided = rules.decide_land(f, LAND, approved, [new_fail, newer_pass, evidence("Pending")])
    assert isinstance(decided, rules.LandPlan)


def test_without_a_landing_check_an_approval_is_enough() -> None:
    assert isinstance(rules.decide_land(facts(), LAND, [approval("Approved")], []), rules.LandPlan)


def test_an_agent_without_landing_targets_lands_nowhere_even_approved() -> None:
    bare = agent().model_copy(update={"landing": Landing()})
    reason = refused(rules.decide_land(facts(agent=bare), LAND, [approval("Approved")], []))
    assert reason == "this Agent lists no landing targets: spec.landing.targets"
    # Refused before a person is asked: no Approval is created for a land that cannot happen.
    refused(rules.decide_land(facts(agent=bare), LAND, [], []), "no landing targets")


def test_a_land_outside_the_targets_is_refused_naming_them() -> None:
    release = agent().model_copy(update={"landing": Landing(targets=["release/*", "main"])})
    prod = {"target": "prod", "revision": SHA}
    approved = approval("Approved", arguments={"target": "prod", "revision": SHA})
    refused(
        rules.decide_land(facts(agent=release), prod, [approved], []),
        "'prod' is outside this Agent's spec.landing.targets (release/*, main)",
    )
    deep = {"target": "release/1/hotfix", "revision": SHA}
    refused(rules.decide_land(facts(agent=release), deep, [], []), "outside")
    ok = {"target": "release/1", "revision": SHA}
    assert isinstance(rules.decide_land(facts(agent=release), ok, [], []), rules.AskApproval)


def test_a_listed_target_still_needs_the_approval_and_the_evidence() -> None:
    f = facts(land_check=CHECK, repo=REPO)
    assert isinstance(rules.decide_land(f, LAND, [], []), rules.AskApproval)
    refused(rules.decide_land(f, LAND, [approval("Approved")], []), "waits for the Evidence")


@pytest.mark.parametrize(
    ("tool_input", "fragment"),
    [
        ({"target": "main", "revision": "HEAD"}, "full 40"),
        ({"target": "main"}, "full 40"),
        ({"target": "--force", "revision": SHA}, "'target'"),
        ({"target": "a..b", "revision": SHA}, "not a valid branch"),
        ({"target": "corral/parent", "revision": SHA}, "use the push tool"),
    ],
)
def test_bad_land_input_is_refused(tool_input: dict[str, Any], fragment: str) -> None:
    refused(rules.decide_land(facts(), tool_input, [approval("Approved")], []), fragment)


def test_request_approval_binds_the_exact_call() -> None:
    ask = rules.approval_request({"tool": "bash", "arguments": {"command": "rm -rf build"}})
    assert isinstance(ask, rules.AskApproval)
    assert ask.digest == action_digest("bash", {"command": "rm -rf build"})
    refused(rules.approval_request({"arguments": {}}), "'tool'")
    refused(rules.approval_request({"tool": "bash", "arguments": "rm"}), "'arguments'")


# ------------------------------------------------------------------------------------- menu


def names(f: SessionFacts) -> list[str]:
    return [t.name for t in menu(f)]


def test_menu_for_an_orchestrator_with_a_branch() -> None:
    assert names(facts()) == [
        "spawn_child",
        "child_status",
        "walk_tree",
        "wait_children",
        "request_approval",
        "push",
        "land",
    ]


def test_menu_follows_the_session_state() -> None:
    leaf = AgentSpec(identity="leaf", model="claude-haiku-4-5", tools=ALL_TOOLS)
    assert names(facts(agent=leaf)) == ["request_approval", "push", "land"]
    assert "spawn_child" not in names(facts(depth=3))
    assert "spawn_child" not in names(facts(turns_used=10))
    assert names(facts(read_only=True, agent=leaf)) == ["request_approval"]
    # No cluster: only what works locally.
    assert names(facts(cluster=False)) == ["push"]
    assert names(facts(cluster=False, branch=None)) == []


def test_menu_tools_pass_the_agents_allow_and_deny_lists() -> None:
    def with_tools(allow: list[str], deny: list[str] | None = None) -> SessionFacts:
        tools = ToolPolicy(allow=allow, deny=deny or [])
        return facts(agent=agent().model_copy(update={"tools": tools}))

    assert names(with_tools([])) == []  # default deny
    assert names(with_tools(["bash", "read"])) == []
    assert names(with_tools(["mcp__corral__push", "mcp__corral__land"])) == ["push", "land"]
    assert names(with_tools(["push"])) == ["push"]  # the bare name matches, as in the harness
    assert "push" not in names(with_tools(["mcp__corral__*"], ["mcp__corral__push"]))
    assert "push" not in names(with_tools(["*"], ["push"]))
    reason = why_not_offered(with_tools(["bash"]), "push")
    assert reason == "mcp__corral__push is not in the Agent's tools.allow"
    reason = why_not_offered(with_tools(["*"], ["mcp__corral__sp*"]), "spawn_child")
    assert reason == "mcp__corral__spawn_child is denied by the Agent's tools.deny"
    # The harness's approval gate may always ask a human; a model's own call may not.
    assert why_not_offered(with_tools(["bash"]), "request_approval", gate=True) is None
    assert why_not_offered(with_tools(["bash"]), "request_approval") is not None


def test_menu_marks_picks_and_gives_schemas() -> None:
    wired = {t.name: t.wire() for t in menu(facts())}
    assert wired["wait_children"]["pick"] is True
    assert wired["push"]["pick"] is False
    # Calls that hand the session to a human end the turn.
    assert wired["request_approval"]["pick"] is True and wired["land"]["pick"] is True
    assert wired["spawn_child"]["input_schema"]["required"] == ["task"]


def test_object_names_from_a_model_cannot_walk_the_api_path() -> None:
    assert rules.is_object_name("lead-child-x7k2p")
    for bad in ("../secrets/model", "a/b", "..", "UPPER", "", "x" * 254, "a..b", None, 3):
        assert not rules.is_object_name(bad), bad


def test_the_gate_never_asks_a_person_about_a_land_no_approval_could_release() -> None:
    ask = rules.AskApproval(
        tool="mcp__corral__land",
        arguments={"target": "prod", "revision": SHA},
        digest="sha256:" + "0" * 64,
        reason="ship it",
    )
    release = agent().model_copy(update={"landing": Landing(targets=["release/*"])})
    refused(rules.gate_action(ask, facts(agent=release)), "'prod' is outside", "release/*")
    bare = agent().model_copy(update={"landing": Landing()})
    refused(rules.gate_action(ask, facts(agent=bare)), "lists no landing targets")
    listed = replace(ask, arguments={"target": "release/2", "revision": SHA})
    action = rules.gate_action(listed, facts(agent=release))
    assert isinstance(action, rules.AskApproval) and action.tool == "land"
    assert action.digest == action_digest("land", {"target": "release/2", "revision": SHA})
