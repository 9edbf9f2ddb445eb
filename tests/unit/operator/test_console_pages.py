"""The console's pages are pure: API objects in, escaped HTML out (docs/console.md)."""

from __future__ import annotations

from typing import Any

from corral_operator.console import pages

NOW = 1_800_000_000.0
CREATED = "2027-01-15T08:00:00Z"


def _session(name: str, parent: str | None = None, **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"agentRef": "coder", "task": "t"}
    if parent:
        spec["parentRef"] = {"name": parent}
    return {
        "metadata": {"name": name, "namespace": "agents", "creationTimestamp": CREATED},
        "spec": spec,
        "status": status,
    }


def test_children_sit_under_their_parent_and_orphans_and_cycles_show_once() -> None:
    sessions = [
        _session("child", "root"),
        _session("root"),
        _session("grandchild", "child"),
        _session("orphan", "gone"),
        _session("a", "b"),
        _session("b", "a"),
    ]
    tree = [(depth, s["metadata"]["name"]) for depth, s in pages.session_tree(sessions)]
    assert (0, "root") in tree and (0, "orphan") in tree
    assert tree.index((0, "root")) + 1 == tree.index((1, "child"))
    assert tree.index((1, "child")) + 1 == tree.index((2, "grandchild"))
    # a and b name each other: neither is at the top, so neither is shown as a root's child;
    # nothing is listed twice.
    assert len(tree) == len({name for _, name in tree})


def test_every_value_is_escaped() -> None:
    evil = _session("x", phase="<script>alert(1)</script>", message="<img src=x onerror=y>")
    evil["spec"]["task"] = "</pre><script>steal()</script>"
    html = pages.session_page("<b>me</b>", evil, [], [], False, NOW)
    assert "<script>alert" not in html and "<script>steal" not in html
    assert "<img src=x" not in html and "<b>me</b>" not in html
    fleet = pages.fleet_page("me", {"agents": [evil]}, 0, NOW)
    assert "<script>alert" not in fleet


def test_the_fleet_sums_cost_and_counts_phases_per_namespace() -> None:
    html = pages.fleet_page(
        "me",
        {
            "agents": [
                _session("a", phase="Running", turns=2, usage={"cost": 0.5, "inputTokens": 10}),
                _session("b", phase="Running", usage={"cost": 0.25}),
                _session("c", phase="Succeeded"),
            ]
        },
        0,
        NOW,
    )
    assert "3 sessions · $0.7500" in html
    assert 'phase-Running">Running</span>&nbsp;2' in html
    assert "$0.5000" in html


def test_decision_buttons_only_for_people_who_may_decide_a_pending_approval() -> None:
    approval = {
        "metadata": {"name": "ap", "namespace": "agents", "creationTimestamp": CREATED},
        "spec": {"sessionRef": {"name": "s"}, "action": {"tool": "land", "arguments": "{}"}},
    }
    decided = {**approval, "status": {"decision": "Approved", "decidedBy": "alice"}}
    assert "button" in pages.approval_rows([approval], {"agents"}, NOW)
    assert "button" not in pages.approval_rows([approval], {"elsewhere"}, NOW)
    assert "you may not decide" in pages.approval_rows([approval], set(), NOW)
    rows = pages.approval_rows([decided], {"agents"}, NOW)
    assert "button" not in rows and "Approved by alice" in rows


def test_goal_waves_show_their_evidence_verdicts() -> None:
    goal = {
        "metadata": {"name": "g", "namespace": "agents"},
        "spec": {"description": "make it pass", "maxWaves": 3},
        "status": {
            "verdict": "Pending",
            "waves": 1,
            "history": [{"wave": 1, "session": "g-1", "evidence": "ev1", "verdict": "Fail"}],
        },
    }
    evidence = {
        "metadata": {"name": "ev1", "namespace": "agents"},
        "spec": {"check": "unit", "revision": "a" * 40},
        "status": {"verdict": "Fail", "exitCode": 2},
    }
    html = pages.goals_page("me", [goal], [evidence], NOW)
    assert "1/3 waves" in html and "ev1 Fail" in html and 'verdict-Fail">Fail' in html


def test_the_session_page_shows_the_gateways_decisions_escaped() -> None:
    egress = {
        "allowed": 4,
        "denied": 1,
        "moreHosts": 3,
        "observedAt": "2027-01-15T08:01:00Z",
        "hosts": [
            {"host": "evil.example", "port": 443, "identity": "agent", "decision": "denied",
             "reason": "<script>x</script> not allowed", "count": 1},
            {"host": "pypi.org", "port": 443, "identity": "agent", "decision": "allowed",
             "count": 4, "bytesUp": 7, "bytesDown": 70},
        ],
    }  # fmt: skip
    html = pages.session_page("me", _session("s", egress=egress), [], [], False, NOW)
    section = html.split('<div id="egress">', 1)[1].split("</div>", 1)[0]
    assert "4 allowed, 1 denied" in section
    assert '<tr class="egress decision-denied"><td>denied</td><td>agent</td>' in section
    assert "evil.example:443" in section and "7 / 70" in section
    assert "<script>x" not in section and "&lt;script&gt;x" in section
    assert "3 more destinations" in section
    none = pages.session_page("me", _session("s"), [], [], False, NOW)
    assert "No egress through the gateway recorded." in none
