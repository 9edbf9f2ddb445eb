"""The full policy inside the real harness process: what the model sees and which calls run."""

from __future__ import annotations

import time
from typing import Any

from tests._scripted import system_text

from ._rig import AGENT, Harness, MenuStandIn, Model


def _events(harness: Harness, conv: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in harness.history(conv) if e["type"] == kind]


def test_agents_md_reaches_the_system_prompt_deepest_last(
    harness: Harness, model: Model, conv: str
) -> None:
    (harness.root / "AGENTS.md").write_text("ROOT-RULE: use tabs\n")
    (harness.root / "pkg").mkdir()
    (harness.root / "pkg" / "AGENTS.md").write_text("DEEP-RULE: use spaces\n")
    model.script(conv, ["ok"])
    harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    system = system_text(model.requests(conv)[0])
    assert system.index("ROOT-RULE") < system.index("DEEP-RULE") < system.index("Be brief.")


def test_tool_search_answers_from_the_policy_not_a_process(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, [{"tool_use": {"name": "tool_search", "input": {"name": "bash"}}}, "ok"])
    harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    first, second = model.requests(conv)
    assert "tool_search" in {t["name"] for t in first["tools"]}
    (result,) = second["messages"][-1]["content"]
    assert "is_error" not in result or result["is_error"] is False
    assert "# bash" in str(result["content"])


def test_a_merge_through_bash_asks_the_custodian_and_runs_only_once_approved(
    harness: Harness, model: Model, menu: tuple[MenuStandIn, str], conv: str
) -> None:
    stand_in = menu[0]
    model.script(
        conv,
        [
            {"tool_use": {"name": "bash", "input": {"command": "git merge x; touch merged"}}},
            {"tool_use": {"name": "bash", "input": {"command": "git merge y; touch merged2"}}},
            "ok",
        ],
    )
    admitted = harness.admit(conv)
    first = harness.wait_for(conv, "approval_requested")
    # The harness asked the custodian, which holds the Approval; nothing ran meanwhile.
    (call,) = [c for c in stand_in.calls if c[0] == conv and c[1] == "request_approval"]
    assert call[2]["tool"] == "bash" and "git merge x" in call[2]["arguments"]["command"]
    time.sleep(0.3)
    assert not (harness.root / "merged").exists()
    stand_in.decisions[first["approvalId"]] = "Approved"
    deadline = time.monotonic() + 10
    while len([e for e in harness.history(conv) if e["type"] == "approval_requested"]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = _events(harness, conv, "approval_requested")[1]
    stand_in.decisions[second["approvalId"]] = "Denied"
    harness.wait_settled(conv, admitted["submissionId"])
    assert (harness.root / "merged").exists()  # the same call, replayed after approval
    assert not (harness.root / "merged2").exists()
    assert [b["outcome"] for b in _events(harness, conv, "tool_blocked")] == ["ask", "ask"]


def test_a_pick_that_ends_the_turn_is_marked_on_its_tool_end(
    harness: Harness, model: Model, menu: tuple[MenuStandIn, str], conv: str
) -> None:
    stand_in = menu[0]
    stand_in.surfaces[conv] = [
        {
            "name": "publish",
            "description": "Publish.",
            "input_schema": {"type": "object"},
            "pick": True,
        }
    ]
    stand_in.answers[(conv, "publish")] = {"content": "published", "endsTurn": True}
    model.script(conv, [{"tool_use": {"name": "mcp__corral__publish", "input": {}}}])
    admitted = harness.admit(conv)
    end = harness.wait_for(conv, "tool_end")
    assert end["endsTurn"] is True
    harness.abort(conv, {"cause": "pick", "submissionId": admitted["submissionId"]})
    assert harness.wait_settled(conv, admitted["submissionId"])["status"] == "ended"


def test_turn_records_keep_only_the_last_twenty(harness: Harness, model: Model, conv: str) -> None:
    model.script(conv, ["ok"] * 23)
    for _ in range(23):
        harness.wait_settled(conv, harness.admit(conv)["submissionId"])
    records = harness.state_dir / "turns" / conv
    names = sorted(int(p.stem.split("-")[1]) for p in records.glob("turn-*.json"))
    assert names == list(range(4, 24))


def test_a_menu_tool_outside_the_allowlist_is_not_offered(
    harness: Harness, model: Model, menu: tuple[MenuStandIn, str], conv: str
) -> None:
    menu[0].surfaces[conv] = [
        {"name": "land", "description": "Land.", "input_schema": {"type": "object"}, "pick": True}
    ]
    model.script(conv, [{"tool_use": {"name": "mcp__corral__land", "input": {}}}, "ok"])
    spec = {**AGENT, "tools": {"allow": ["read"]}}
    harness.wait_settled(conv, harness.admit(conv, spec=spec)["submissionId"])
    assert "mcp__corral__land" not in {t["name"] for t in model.requests(conv)[0]["tools"]}
    assert [c for c in menu[0].calls if c[0] == conv] == []
