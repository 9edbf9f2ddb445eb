"""The full policy inside the real harness process: what the model sees and which calls run."""

from __future__ import annotations

import json
from typing import Any

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
    system = model.requests(conv)[0]["system"]
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


def test_a_merge_through_bash_asks_and_a_denial_keeps_it_from_running(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            {"tool_use": {"name": "bash", "input": {"command": "git merge topic && touch merged"}}},
            "ok",
        ],
    )
    admitted = harness.admit(conv)
    asked = harness.wait_for(conv, "approval_requested")
    approvals = harness.state_dir / "approvals"
    # The local approval port: a human decides by writing the decision into the request file.
    (path,) = [p for p in approvals.iterdir() if asked["approvalId"] in p.name]
    record = json.loads(path.read_text())
    record["decision"] = "denied"
    path.write_text(json.dumps(record))
    harness.wait_settled(conv, admitted["submissionId"])
    assert not (harness.root / "merged").exists()
    (blocked, *_) = _events(harness, conv, "tool_blocked")
    assert blocked["outcome"] == "ask"


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
