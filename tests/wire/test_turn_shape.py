"""The turn's shape through the wire (docs/turns.md): every route, the ask-and-stop path, the
fallback and its refusal under decideThenAct, an off-path step rejected, and forced plans whose
steps are checked by a machine, replanned once, then struck.

The real harness process runs each turn against the scripted model, which plays the classifier
(`classify`) and the planner (`plan`, `plan_edit`) as well as the model.
"""

from __future__ import annotations

from typing import Any

import pytest

from ._rig import AGENT, Harness, Model

pytestmark = pytest.mark.timeout(60)

CLASSIFIED = {**AGENT, "scheduler": {"classifierModel": "corral-scripted"}}


def _agent(**fields: Any) -> dict[str, Any]:
    return {**AGENT, **fields}


def _kinds(harness: Harness, conv: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in harness.history(conv) if e["type"] == kind]


def _turn(harness: Harness, conv: str, **body: Any) -> dict[str, Any]:
    admitted = harness.admit(conv, **body)
    return harness.wait_settled(conv, admitted["submissionId"], admitted["offset"])


def _classify(route: str, **more: Any) -> dict[str, Any]:
    return {
        "classify": {
            "understood": "the task",
            "done": "when it is answered",
            "clear": True,
            "route": route,
            **more,
        }
    }


def test_direct_route_rejects_a_tool_call_off_its_path(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [{"tool_use": {"name": "bash", "input": {"command": "touch ran.txt"}}}, "It is 4."],
    )
    settled = _turn(harness, conv, message="2+2?", spec=_agent(loop="direct"))
    assert settled["status"] == "completed", (settled.get("error"), settled.get("plan"))
    assert settled["text"] == "It is 4."
    receipt = settled["receipt"]
    assert receipt["route"] == "direct" and receipt["handler"] == "direct"
    assert receipt["toolsRun"] == [] and receipt["toolsBlocked"] == ["bash"]
    assert receipt["phasePath"] == ["understand", "choose_route", "answer", "done"]
    assert not (harness.root / "ran.txt").exists()  # rejected, never run
    (rejected,) = _kinds(harness, conv, "step_rejected")
    assert "not a step of the turn's answer phase" in rejected["reason"]
    # The model read the rejection as the call's error result.
    result = model.requests(conv)[1]["messages"][-1]["content"][0]
    assert result["is_error"] is True and "answer phase" in str(result["content"])


def test_classifier_picks_one_tool_and_a_second_call_is_off_path(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            _classify("oneTool"),
            {"tool_use": {"name": "bash", "input": {"command": "echo one > one.txt"}}},
            {"tool_use": {"name": "bash", "input": {"command": "echo two > two.txt"}}},
            "Wrote one.txt.",
        ],
    )
    settled = _turn(harness, conv, message="write one.txt", spec=CLASSIFIED)
    assert settled["status"] == "completed", (settled.get("error"), settled.get("plan"))
    receipt = settled["receipt"]
    assert receipt["route"] == "oneTool" and receipt["requestedLoop"] == "auto"
    assert receipt["toolsRun"] == ["bash"] and receipt["toolsBlocked"] == ["bash"]
    assert (harness.root / "one.txt").exists() and not (harness.root / "two.txt").exists()
    assert receipt["phasePath"] == [
        "understand", "choose_route", "execute", "check", "answer", "done",
    ]  # fmt: skip
    assert receipt["tokensByLayer"]["classifier"] > 0 and receipt["tokensByLayer"]["executor"] > 0
    # The classifier's call: its own system prompt and only the classify tool; not in the
    # transcript the model sees next.
    first, second = model.requests(conv)[:2]
    assert [t["name"] for t in first["tools"]] == ["classify"]
    assert "scheduler" in first["system"]
    assert all("classify" not in str(m) for m in second["messages"])
    (understood,) = _kinds(harness, conv, "understood")
    assert understood["done"] == "when it is answered"


def test_classifier_picks_the_reactive_loop(harness: Harness, model: Model, conv: str) -> None:
    model.script(
        conv,
        [
            _classify("reactive"),
            {"tool_use": {"name": "bash", "input": {"command": "echo a"}}},
            {"tool_use": {"name": "bash", "input": {"command": "echo b"}}},
            "done",
        ],
    )
    settled = _turn(harness, conv, spec=CLASSIFIED)
    receipt = settled["receipt"]
    assert settled["status"] == "completed"
    assert (receipt["route"], receipt["handler"]) == ("reactive", "reactive")
    assert receipt["toolsRun"] == ["bash", "bash"]
    assert receipt["tokensByLayer"]["reactive"] > 0
    assert receipt["phasePath"] == [
        "understand", "choose_route", "execute", "check", "answer", "done",
    ]  # fmt: skip


def test_checklist_route_plans_then_runs_each_step_under_its_check(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            {
                "plan": [
                    {"action": "say ready", "check": {"token": "READY"}},
                    {"action": "count", "check": {"json": {"path": "n", "equals": "2"}}},
                ]
            },
            {"tool_use": {"name": "bash", "input": {"command": "echo READY"}}},
            "step one done",
            {"tool_use": {"name": "bash", "input": {"command": "echo '{\"n\": 2}'"}}},
            "step two done",
        ],
    )
    settled = _turn(harness, conv, spec=_agent(loop="checklist"))
    assert settled["status"] == "completed", (settled.get("error"), settled.get("plan"))
    plan = settled["plan"]
    assert plan["state"] == "Done"
    assert [s["verdict"] for s in plan["steps"]] == ["Held", "Held"]
    receipt = settled["receipt"]
    assert receipt["route"] == "checklist"
    assert receipt["tokensByLayer"]["planner"] > 0
    assert receipt["phasePath"] == [
        "understand", "choose_route", "plan", "execute", "check", "execute", "check",
        "answer", "done",
    ]  # fmt: skip
    assert settled["text"].startswith("The plan is done: 2 of 2 steps held.")
    # The runtime wrote the plan's body into the transcript the model reads.
    step_request = model.requests(conv)[1]
    assert "The plan (written by the runtime" in str(step_request["messages"])


def test_investigate_then_classify_again(harness: Harness, model: Model, conv: str) -> None:
    (harness.root / "notes.txt").write_text("the answer is 42\n")
    model.script(
        conv,
        [
            _classify("investigate"),
            {"tool_use": {"name": "bash", "input": {"command": "touch made.txt"}}},
            {"tool_use": {"name": "read", "input": {"path": "notes.txt"}}},
            "notes.txt says 42",
            _classify("direct"),
            "The answer is 42.",
        ],
    )
    settled = _turn(harness, conv, spec=CLASSIFIED)
    assert settled["status"] == "completed", (settled.get("error"), settled.get("plan"))
    receipt = settled["receipt"]
    assert receipt["phasePath"] == [
        "understand", "choose_route", "investigate", "understand", "choose_route", "answer",
        "done",
    ]  # fmt: skip
    assert receipt["route"] == "direct" and receipt["toolsRun"] == ["read"]
    assert receipt["toolsBlocked"] == ["bash"]  # a read-only investigation runs no command
    assert not (harness.root / "made.txt").exists()
    # The second classification saw what the investigation found.
    assert "notes.txt says 42" in str(model.requests(conv)[4]["messages"])


def test_unclear_task_asks_and_stops_then_starts_from_the_reply(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            {
                "classify": {
                    "understood": "fix a file",
                    "done": "the file is fixed",
                    "clear": False,
                    "question": "Which file?",
                }
            },
            {**_classify("direct"), "when": {"last_user_contains": "answered"}},
            "I will fix b.txt.",
        ],
    )
    asked = _turn(harness, conv, message="fix the file", spec=CLASSIFIED)
    assert asked["status"] == "completed"
    assert asked["question"] == "Which file?"
    assert asked["receipt"]["outcome"] == "handed_to_human"
    assert asked["receipt"]["phasePath"] == ["understand", "ask", "wait_for_human", "stopped"]
    assert len(model.requests(conv)) == 1  # asked, and nothing else ran
    answered = _turn(harness, conv, message="b.txt", replies=["b.txt"], spec=CLASSIFIED)
    assert answered["status"] == "completed", answered
    assert answered["text"] == "I will fix b.txt."
    assert answered.get("question") is None
    assert answered["receipt"]["outcome"] == "success"


def test_without_a_classifier_the_turn_falls_back_to_the_reactive_loop(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, ["plain answer"])
    settled = _turn(harness, conv)
    receipt = settled["receipt"]
    assert settled["status"] == "completed"
    assert (receipt["route"], receipt["handler"]) == ("reactive", "reactive_fallback")
    assert receipt["requestedLoop"] == "auto"


def test_decide_then_act_refuses_the_fallback(harness: Harness, model: Model, conv: str) -> None:
    model.script(conv, ["must not be asked"])
    settled = _turn(harness, conv, decideThenAct=True)
    assert settled["status"] == "failed"
    assert settled["error"]["type"] == "classifier_unavailable"
    assert "decideThenAct" in settled["error"]["message"]
    assert model.requests(conv) == []


def test_a_failing_classifier_falls_back_unless_decide_then_act(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(conv, ["no classify call here", "reactive answer"])
    settled = _turn(harness, conv, spec=CLASSIFIED)
    assert settled["status"] == "completed"
    assert settled["receipt"]["handler"] == "reactive_fallback"
    assert settled["text"] == "reactive answer"
    model.script(conv, [{"fault": {"status": 400, "type": "invalid_request_error"}}])
    refused = _turn(harness, conv, spec=CLASSIFIED, decideThenAct=True)
    assert refused["status"] == "failed"
    assert refused["error"]["type"] == "classifier_unavailable"
    assert "invalid_request_error" in refused["error"]["message"]


PLAN = {
    "steps": [
        {"action": "say OK", "check": {"token": "OK"}},
        {"action": "turn it green", "check": {"contains": "GREEN", "absent": "RED"}},
        {"action": "run the tests", "check": {"exitCode": 0}},
    ]
}


def test_forced_plan_step_misses_is_replanned_then_a_second_miss_strikes_the_tail(
    harness: Harness, model: Model, conv: str
) -> None:
    model.script(
        conv,
        [
            {"tool_use": {"name": "bash", "input": {"command": "echo OK"}}},
            "step 1 done",
            {"tool_use": {"name": "bash", "input": {"command": "echo RED"}}},
            "Step 2 is done: everything is GREEN.",  # the model's claim; never read
            {"plan_edit": {"step": 2, "action": "paint it green", "check": {"contains": "GREEN"}}},
            {"tool_use": {"name": "bash", "input": {"command": "echo still RED"}}},
            "GREEN GREEN GREEN",
        ],
    )
    settled = _turn(harness, conv, plan=PLAN)
    assert settled["status"] == "failed", settled
    assert settled["error"]["type"] == "plan_struck"
    steps = settled["plan"]["steps"]
    assert [s["verdict"] for s in steps] == ["Held", "Struck", "Struck"]
    assert steps[1]["action"] == "paint it green" and steps[1]["attempts"] == 2
    assert settled["plan"]["state"] == "Struck"
    receipt = settled["receipt"]
    assert receipt["handler"] == "forced_plan" and receipt["outcome"] == "partial"
    assert receipt["phasePath"] == [
        "understand", "choose_route", "plan", "execute", "check", "execute", "check",
        "plan", "execute", "check", "failed",
    ]  # fmt: skip
    verdicts = [(e["step"], e["held"]) for e in _kinds(harness, conv, "step_verdict")]
    assert verdicts == [(1, True), (2, False), (2, False)]


EVIDENCE = "test -f done.txt"


def test_forced_plan_step_misses_once_and_holds_after_the_replan(
    harness: Harness, model: Model, conv: str
) -> None:
    plan = {
        "steps": [
            {"action": "make done.txt", "check": {"evidence": EVIDENCE}},
            {"action": "show it", "check": {"either": [{"token": "yes"}, {"exitCode": 7}]}},
        ]
    }
    model.script(
        conv,
        [
            {"tool_use": {"name": "bash", "input": {"command": "echo made > done.tx"}}},
            "done.txt is there",
            {"plan_edit": {"step": 1, "action": "spelt right", "check": {"evidence": EVIDENCE}}},
            {"tool_use": {"name": "write", "input": {"path": "done.txt", "content": "x"}}},
            "made it",
            {"tool_use": {"name": "bash", "input": {"command": "exit 7"}}},
            "shown",
        ],
    )
    settled = _turn(harness, conv, plan=plan)
    assert settled["status"] == "completed", (settled.get("error"), settled.get("plan"))
    steps = settled["plan"]["steps"]
    assert [(s["verdict"], s["attempts"]) for s in steps] == [("Held", 2), ("Held", 1)]
    evidence = _kinds(harness, conv, "evidence")
    assert [e["exitCode"] for e in evidence] == [1, 0]
    # The evidence command never reached the model: it ran outside the agent's tool loop.
    assert "test -f" not in str(model.requests(conv)[-1]["messages"][-1])


def test_gated_plan_waits_for_a_person_then_runs(harness: Harness, model: Model, conv: str) -> None:
    model.script(
        conv,
        [
            {"tool_use": {"name": "bash", "input": {"command": "echo OK"}}},
            "ok",
        ],
    )
    plan = {"gate": True, "steps": [{"action": "say OK", "check": {"token": "OK"}}]}
    gated = _turn(harness, conv, plan=plan)
    assert gated["status"] == "completed"
    assert gated["question"].startswith("Approve this plan?")
    assert gated["plan"]["state"] == "Gated"
    assert gated["receipt"]["outcome"] == "handed_to_human"
    assert model.requests(conv) == []
    ran = _turn(harness, conv, message="yes", replies=["yes"], plan=plan)
    assert ran["status"] == "completed", ran
    assert ran["plan"]["state"] == "Done"


def test_a_refused_gate_fails_the_plan(harness: Harness, model: Model, conv: str) -> None:
    plan = {"gate": True, "steps": [{"action": "say OK", "check": {"token": "OK"}}]}
    _turn(harness, conv, plan=plan)
    refused = _turn(harness, conv, message="no, not that", replies=["no, not that"], plan=plan)
    assert refused["status"] == "failed"
    assert refused["error"]["type"] == "plan_refused"
    assert model.requests(conv) == []


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("plan", {"steps": [{"action": "x", "check": {}}]}, "a check needs at least one test"),
        ("plan", {"steps": [{"action": "x"}]}, "check"),
        ("decideThenAct", "sometimes", "decideThenAct"),
        ("replies", [7], "replies"),
    ],
)
def test_a_bad_shape_field_is_refused_at_admission(
    harness: Harness, conv: str, field: str, value: Any, reason: str
) -> None:
    response = harness.post(
        f"/agents/agent/{conv}", {"message": "go", "agent": AGENT, field: value}
    )
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"] == "bad_request" and reason in body["reason"]
