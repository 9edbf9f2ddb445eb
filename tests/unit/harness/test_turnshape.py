"""The turn's shape as pure data and functions: the phase table, the scheduler's decisions,
the plan's verdict rules and every kind of machine check (docs/turns.md)."""

from __future__ import annotations

import pytest

from corral_api.turnshape import PlanStep, StepCheck
from corral_harness.turnshape.checks import Evidence, ToolOutcome, verdict
from corral_harness.turnshape.phases import (
    TERMINAL,
    TRANSITIONS,
    OffPath,
    Phase,
    PhaseMachine,
    step_refusal,
)
from corral_harness.turnshape.plan import PLAN_EDIT, PLAN_OPEN, PlanBook
from corral_harness.turnshape.scheduler import (
    Classification,
    after_classification,
    parse_classification,
    start,
)

CLEAN = [
    Phase.CHOOSE_ROUTE, Phase.PLAN, Phase.EXECUTE, Phase.CHECK, Phase.ANSWER, Phase.DONE,
]  # fmt: skip


def test_the_clean_path_is_a_walk_of_the_table_and_each_phase_is_written_once_at_its_end() -> None:
    entered: list[str] = []
    ended: list[tuple[str, str]] = []
    machine = PhaseMachine(lambda p: entered.append(p.value), lambda p, d: ended.append((p, d)))
    for phase in CLEAN:
        machine.move(phase, detail=f"into {phase.value}")
    assert machine.names() == ["understand", *(p.value for p in CLEAN)]
    assert entered == machine.names()
    # Each phase once, at its end (the terminal phase too), with the detail of its ending.
    assert [p for p, _ in ended] == machine.path
    assert ended[0] == (Phase.UNDERSTAND, "into choose_route")
    assert machine.over


def test_terminal_phases_lead_nowhere_and_any_other_may_stop_or_fail() -> None:
    for phase in Phase:
        if phase in TERMINAL:
            assert TRANSITIONS[phase] == frozenset()
        else:
            assert {Phase.STOPPED, Phase.FAILED} - {phase} <= TRANSITIONS[phase]


def test_an_answer_given_stays_given() -> None:
    machine = PhaseMachine()
    machine.walk(Phase.CHOOSE_ROUTE, Phase.ANSWER)
    for back in (Phase.EXECUTE, Phase.PLAN, Phase.CHECK, Phase.UNDERSTAND):
        with pytest.raises(OffPath, match="answer -> "):
            machine.move(back)
    assert machine.current is Phase.ANSWER


def test_each_phase_admits_only_its_own_steps() -> None:
    assert step_refusal(Phase.EXECUTE, "work", "bash") is None
    assert step_refusal(Phase.EXECUTE, "read", "read") is None
    assert "read-only investigation" in str(step_refusal(Phase.INVESTIGATE, "work", "bash"))
    assert step_refusal(Phase.INVESTIGATE, "read", "grep") is None
    assert step_refusal(Phase.PLAN, "plan", PLAN_OPEN) is None
    assert "plan phase" in str(step_refusal(Phase.PLAN, "work", "bash"))
    assert "answer phase" in str(step_refusal(Phase.ANSWER, "read", "read"))
    assert "plan_open" in str(step_refusal(Phase.EXECUTE, "plan", PLAN_OPEN))


def test_the_scheduler_starts_a_turn_by_its_loop_plan_and_classifier() -> None:
    def first(**kw: object) -> tuple[str, str | None, str]:
        args = {"loop": "auto", "forced_plan": False, "classifier_model": None}
        args.update(kw)
        got = start(decide_then_act=bool(args.pop("dta", False)), **args)  # type: ignore[arg-type]
        return got.action, got.route, got.handler

    assert first() == ("route", "reactive", "reactive_fallback")
    assert first(dta=True)[0] == "stop"
    assert first(classifier_model="small") == ("classify", None, "")
    assert first(loop="oneTool", dta=True) == ("route", "oneTool", "oneTool")
    assert first(forced_plan=True, loop="direct") == ("route", "checklist", "forced_plan")


def test_the_classifiers_answer_is_checked_and_an_investigation_happens_once() -> None:
    assert "clear (boolean)" in str(parse_classification({"understood": "x", "done": "y"}))
    assert "ask a question" in str(
        parse_classification({"understood": "x", "done": "y", "clear": False})
    )
    assert "route must be" in str(
        parse_classification({"understood": "x", "done": "y", "clear": True, "route": "plan"})
    )
    found = parse_classification(
        {"understood": "x", "done": "y", "clear": True, "route": "investigate"}
    )
    assert isinstance(found, Classification)
    assert after_classification(found, decide_then_act=False, investigated=False).route == (
        "investigate"
    )
    again = after_classification(found, decide_then_act=False, investigated=True)
    assert (again.route, again.reason) == ("reactive", "investigated once already")
    broken = after_classification(
        "it did not call classify", decide_then_act=True, investigated=False
    )
    assert broken.action == "stop" and "classifier failed" in broken.reason


def _check(**fields: object) -> StepCheck:
    return StepCheck.model_validate(fields)


BASH_OK = ToolOutcome("bash", "tests: OK\n", False)
BASH_FAIL = ToolOutcome("bash", "boom\n[exit code 3]", True)
JSON = ToolOutcome("read", '{"a": {"items": [1, {"b": "x"}]}, "n": 2}', False)


@pytest.mark.parametrize(
    ("check", "results", "held"),
    [
        ({"token": "OK"}, [BASH_OK], True),
        ({"token": "O"}, [BASH_OK], False),  # a token is a whole word, not a substring
        ({"contains": "sts: O"}, [BASH_OK], True),
        ({"absent": "boom"}, [BASH_OK], True),
        ({"absent": "boom"}, [BASH_OK, BASH_FAIL], False),
        ({"exitCode": 0}, [BASH_OK], True),
        ({"exitCode": 3}, [BASH_OK, BASH_FAIL], True),  # the last command counts
        ({"exitCode": 0}, [JSON], False),  # no command ran
        ({"json": {"path": "a.items.1.b", "equals": "x"}}, [JSON], True),
        ({"json": {"path": "n", "equals": "2"}}, [JSON], True),
        ({"json": {"path": "n", "equals": "3"}}, [JSON], False),
        ({"json": {"path": "a.missing"}}, [JSON], False),
        ({"token": "OK", "exitCode": 0}, [BASH_OK], True),  # a combination: all must hold
        ({"token": "OK", "exitCode": 1}, [BASH_OK], False),
        ({"either": [{"exitCode": 9}, {"contains": "boom"}]}, [BASH_FAIL], True),
        ({"either": [{"exitCode": 9}, {"contains": "nope"}]}, [BASH_FAIL], False),
    ],
)
def test_every_kind_of_check(
    check: dict[str, object], results: list[ToolOutcome], held: bool
) -> None:
    assert verdict(_check(**check), results, {})[0] is held


def test_an_evidence_check_reads_only_what_the_runtime_ran() -> None:
    check = _check(evidence="make test")
    assert verdict(check, [BASH_OK], {"make test": Evidence(0, "")})[0]
    held, detail = verdict(check, [BASH_OK], {"make test": Evidence(2, "")})
    assert not held and "exited 2" in detail
    assert "did not finish" in verdict(check, [], {"make test": Evidence(None, "")})[1]


def test_a_miss_replans_once_then_a_second_miss_strikes_the_unfinished_tail() -> None:
    book = PlanBook()
    book.open([PlanStep(action=f"s{i}", check=_check(token="OK")) for i in (1, 2, 3)])
    assert book.record(0, True, "held") == "next"
    assert book.record(1, False, "no OK") == "replan"
    assert book.current() == 1 and book.steps[1].verdict == "Missed"
    text, is_error = book.call(PLAN_EDIT, {"step": 1, "action": "x", "check": {"token": "Y"}})
    assert is_error and "held: it cannot change" in text
    _, is_error = book.call(PLAN_EDIT, {"step": 2, "action": "s2 again", "check": {"token": "Y"}})
    assert not is_error and book.steps[1].action == "s2 again"
    assert book.record(1, False, "no Y") == "strike"
    assert [s.verdict for s in book.steps] == ["Held", "Struck", "Struck"]
    assert book.state == "Struck"


def test_the_plan_tools_refuse_a_bad_plan_and_leave_it_unchanged() -> None:
    book = PlanBook()
    text, is_error = book.call(PLAN_OPEN, {"steps": [{"action": "x", "check": {}}]})
    assert is_error and "a check needs at least one test" in text and not book.opened
    text, is_error = book.call(PLAN_OPEN, {"steps": []})
    assert is_error and "non-empty" in text
    _, is_error = book.call(PLAN_OPEN, {"steps": [{"action": "x", "check": {"exitCode": 0}}]})
    assert not is_error and book.state == "Open"
    assert "already open" in book.call(PLAN_OPEN, {"steps": []})[0]
    assert "1. [Pending] x" in book.render()


def test_the_scripted_model_plays_the_classifier_and_the_planner() -> None:
    from corral_dev.scripted import ScriptError, parse_script

    script = parse_script(
        [
            {"classify": {"understood": "u", "done": "d", "clear": True, "route": "direct"}},
            {"plan": [{"action": "a", "check": {"token": "OK"}}]},
            {"plan_edit": {"step": 1, "action": "b", "check": {"exitCode": 0}}},
        ]
    )
    uses = [reply.content[0] for reply in script.default]
    assert [u["name"] for u in uses] == ["classify", "plan_open", "plan_edit_step"]
    assert uses[1]["input"] == {"steps": [{"action": "a", "check": {"token": "OK"}}]}
    assert all(reply.final_stop_reason() == "tool_use" for reply in script.default)
    with pytest.raises(ScriptError, match="classify is a mapping"):
        parse_script([{"classify": "direct"}])
