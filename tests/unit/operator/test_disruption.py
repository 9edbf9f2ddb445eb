"""A Session's PodDisruptionBudget (operator/corral_operator/session/disruption.py): what each
`Agent.spec.sandbox.disruption` policy holds, and how a turn's admission, settlement and
max-wait hold and lift it against an API server stand-in."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any, cast

import pytest

from corral_api.kinds import Disruption, DisruptionPolicy, Sandbox
from corral_kube import Conflict, KubeUnreachable
from corral_operator import naming
from corral_operator.session.context import LoopContext
from corral_operator.session.disruption import (
    ANNOTATION_TURN,
    TurnBudget,
    disruption_budget,
    is_stale,
    lifted_at_settlement,
    lifted_by_timer,
    max_wait,
)

POD = {"metadata": {"name": "corral-fix-it", "namespace": "agents", "uid": "pod-1"}}
PATH = "/apis/policy/v1/namespaces/agents/poddisruptionbudgets/corral-fix-it"


def _budget(
    policy: DisruptionPolicy = "whenIdle", turn: int = 3, pod: dict[str, Any] = POD
) -> dict[str, Any]:
    found = disruption_budget(Disruption(policy=policy), "fix-it", pod, turn)
    assert found is not None
    return found


# -------------------------------------------------------------------------- the decision


def test_allow_holds_no_budget() -> None:
    assert disruption_budget(Disruption(policy="allow"), "fix-it", POD, 1) is None
    assert not lifted_at_settlement(Disruption(policy="allow"))
    assert max_wait(Disruption(policy="allow")) is None


def test_when_idle_is_the_default_and_holds_a_budget_for_the_turn_named_on_it() -> None:
    assert Disruption().policy == "whenIdle"
    # An Agent that names none (or was made before the field) gets the same.
    assert Sandbox().disruption is None and Sandbox().disruption_policy() == Disruption()
    budget = _budget(turn=3)
    assert budget["apiVersion"] == "policy/v1" and budget["kind"] == "PodDisruptionBudget"
    md = budget["metadata"]
    assert md["name"] == naming.pod_name("fix-it") == "corral-fix-it"
    assert md["namespace"] == "agents"
    assert md["annotations"] == {ANNOTATION_TURN: "3"}
    # Lifted at the settlement, and after the default 900 s of the turn at most.
    assert lifted_at_settlement(Disruption())
    assert max_wait(Disruption()) == 900.0
    assert max_wait(Disruption(max_wait_seconds=60)) == 60.0


def test_the_budget_allows_no_disruption_of_exactly_the_sandbox_pod_and_goes_with_it() -> None:
    budget = _budget()
    # minAvailable 1 of the one pod selected: no eviction while it is held.
    assert budget["spec"]["minAvailable"] == 1 and "maxUnavailable" not in budget["spec"]
    assert budget["spec"]["selector"] == {
        "matchLabels": {
            "corral.dev/session": "fix-it",
            "app.kubernetes.io/component": "sandbox",
        }
    }
    assert budget["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "corral-fix-it",
            "uid": "pod-1",
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]


def test_a_long_session_name_selects_by_its_bounded_label_as_its_pod_carries_it() -> None:
    name = "a-session-with-a-name-far-longer-than-any-label-value-may-be-" * 2
    pod = {"metadata": {"name": naming.pod_name(name), "namespace": "agents", "uid": "u"}}
    found = disruption_budget(Disruption(), name, pod, 1)
    assert found is not None
    label = found["spec"]["selector"]["matchLabels"]["corral.dev/session"]
    assert label == naming.label_value(name) and len(label) <= 63
    assert found["metadata"]["name"] == naming.pod_name(name)


def test_an_adopted_warm_pod_is_owned_by_its_own_name_and_the_budget_keeps_the_sessions() -> None:
    pod = {"metadata": {"name": "corral-pool-coder-x7", "namespace": "agents", "uid": "u-9"}}
    budget = _budget(pod=pod)
    assert budget["metadata"]["name"] == "corral-fix-it"
    assert budget["metadata"]["ownerReferences"][0]["name"] == "corral-pool-coder-x7"
    assert budget["metadata"]["ownerReferences"][0]["uid"] == "u-9"


def test_never_holds_a_budget_no_turn_lifts() -> None:
    never = Disruption(policy="never", max_wait_seconds=10)
    budget = _budget("never")
    assert budget["metadata"]["annotations"] == {}
    assert not lifted_at_settlement(never)
    assert max_wait(never) is None
    assert not lifted_by_timer(budget, 3)


def test_a_turns_timer_lifts_only_a_budget_that_turn_or_an_earlier_one_holds() -> None:
    assert lifted_by_timer(_budget(turn=3), 3)
    assert lifted_by_timer(_budget(turn=2), 3)  # left behind by a settlement not applied
    assert not lifted_by_timer(_budget(turn=4), 3)  # the next turn's: its own timer runs
    assert not lifted_by_timer(None, 3)


def test_a_budget_of_an_earlier_pod_or_another_turn_is_stale() -> None:
    wanted = _budget(turn=3)
    assert not is_stale(_budget(turn=3), wanted)
    other_pod = {"metadata": {**POD["metadata"], "uid": "pod-0"}}
    assert is_stale(_budget(turn=3, pod=other_pod), wanted)
    assert is_stale(_budget(turn=2), wanted)
    assert not is_stale(_budget("never", turn=1), _budget("never", turn=5))


# ----------------------------------------------------------- holding it (a stand-in server)


class StandIn:
    """What TurnBudget uses of the loop's context and the API server, in memory: one budget
    at most, and every call in order."""

    namespace = "agents"
    name = "fix-it"

    def __init__(self, pod: dict[str, Any] | None = POD) -> None:
        self.pod = pod
        self.stored: dict[str, Any] | None = None
        self.calls: list[str] = []
        self.failing = False
        self.tasks: list[asyncio.Task[None]] = []
        self.kube = self

    # the context
    async def read_pod(self) -> dict[str, Any] | None:
        return self.pod

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.create_task(work))

    # the API server
    async def create(self, manifest: dict[str, Any]) -> bool:
        self.calls.append("create")
        await asyncio.sleep(0)
        if self.failing:
            raise KubeUnreachable("the API server is away")
        if self.stored is not None:
            return False
        self.stored = manifest
        return True

    async def get(self, path: str) -> dict[str, Any] | None:
        assert path == PATH
        self.calls.append("get")
        return self.stored

    async def delete(self, path: str) -> bool:
        assert path == PATH
        self.calls.append("delete")
        if self.failing:
            raise Conflict(409, "busy")
        gone, self.stored = self.stored is not None, None
        return gone

    def turn(self) -> str | None:
        held = self.stored
        return None if held is None else held["metadata"]["annotations"][ANNOTATION_TURN]


@pytest.fixture
async def server() -> AsyncIterator[StandIn]:
    stand_in = StandIn()
    yield stand_in
    for task in stand_in.tasks:  # a timer still waiting
        task.cancel()


def _follower(stand_in: StandIn, **disruption: Any) -> TurnBudget:
    return TurnBudget(cast(LoopContext, stand_in), Disruption(**disruption))


async def test_a_turn_holds_the_budget_from_its_admission_to_its_settlement(
    server: StandIn,
) -> None:
    budget = _follower(server)
    await budget.follow({"type": "admitted", "turn": 1})
    assert server.turn() == "1"
    await budget.follow({"type": "settled", "turn": 1})
    assert server.stored is None
    await budget.follow({"type": "admitted", "turn": 2})
    assert server.turn() == "2"


async def test_a_settlement_reported_right_after_its_admission_never_overtakes_it(
    server: StandIn,
) -> None:
    budget = _follower(server)
    admitted = asyncio.create_task(budget.follow({"type": "admitted", "turn": 1}))
    settled = asyncio.create_task(budget.follow({"type": "settled", "turn": 1}))
    await asyncio.gather(admitted, settled)
    assert server.calls == ["create", "delete"]
    assert server.stored is None


async def test_the_max_wait_lifts_a_turn_in_flights_budget_and_no_later_turns(
    server: StandIn,
) -> None:
    budget = _follower(server, max_wait_seconds=0)
    await budget.follow({"type": "admitted", "turn": 1})
    assert server.stored is not None and len(server.tasks) == 1
    await server.tasks[0]
    assert server.stored is None  # turn 1 has not settled: its wait is over all the same

    short = _follower(server, max_wait_seconds=1)
    await short.follow({"type": "admitted", "turn": 2})
    await short.follow({"type": "settled", "turn": 2})
    # The next turn holds it (its own wait is longer) when turn 2's timer fires.
    await _follower(server, max_wait_seconds=60).follow({"type": "admitted", "turn": 3})
    waited = asyncio.get_running_loop().time()
    await server.tasks[1]
    assert asyncio.get_running_loop().time() - waited > 0.5
    assert server.turn() == "3"


async def test_never_holds_the_budget_across_turns_with_no_timer(server: StandIn) -> None:
    budget = _follower(server, policy="never")
    await budget.follow({"type": "admitted", "turn": 1})
    held = server.stored
    await budget.follow({"type": "settled", "turn": 1})
    await budget.follow({"type": "admitted", "turn": 2})
    assert server.stored is held
    assert server.calls == ["create", "create", "get"]  # the second meets the first: kept
    assert server.tasks == []


async def test_allow_makes_no_call(server: StandIn) -> None:
    budget = _follower(server, policy="allow")
    await budget.follow({"type": "admitted", "turn": 1})
    await budget.follow({"type": "settled", "turn": 1})
    assert server.calls == [] and server.tasks == []


async def test_a_budget_left_by_an_earlier_pod_is_replaced(server: StandIn) -> None:
    server.stored = _budget(turn=1, pod={"metadata": {**POD["metadata"], "uid": "pod-0"}})
    budget = _follower(server)
    await budget.follow({"type": "admitted", "turn": 1})
    assert server.calls == ["create", "get", "delete", "create"]
    assert server.stored is not None
    assert server.stored["metadata"]["ownerReferences"][0]["uid"] == "pod-1"


async def test_no_pod_no_budget() -> None:
    server = StandIn(pod=None)
    await _follower(server).follow({"type": "admitted", "turn": 1})
    assert server.calls == [] and server.tasks == []


async def test_a_failed_call_is_a_warning_and_the_turn_goes_on(
    server: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    server.failing = True
    budget = _follower(server)
    with caplog.at_level(logging.WARNING, logger="corral.operator.session"):
        await budget.follow({"type": "admitted", "turn": 1})
        await budget.follow({"type": "settled", "turn": 1})
    messages = [r.getMessage() for r in caplog.records]
    assert any("not held for turn 1" in m and "away" in m for m in messages), messages
    assert any("not lifted for turn 1" in m for m in messages), messages
    assert server.tasks == []  # nothing held: no timer


async def test_a_turn_taken_over_keeps_its_budget_and_its_wait_starts_again(
    server: StandIn,
) -> None:
    """The operator that admitted turn 1 is gone (its timer with it): the one that re-attaches
    keeps the budget it left, without replacing it, and lifts it after its own max-wait."""
    await _follower(server, max_wait_seconds=60).follow({"type": "admitted", "turn": 1})
    left = server.stored
    server.calls.clear()
    taken_over = _follower(server, max_wait_seconds=0)
    await taken_over.follow({"type": "reattached", "turn": 1})
    assert server.stored is left and server.calls == ["create", "get"]  # kept as it was
    await server.tasks[-1]
    assert server.stored is None  # the new operator's wait lifted it


async def test_a_turn_taken_over_without_its_budget_is_given_one(server: StandIn) -> None:
    await _follower(server).follow({"type": "reattached", "turn": 4})
    assert server.turn() == "4"
