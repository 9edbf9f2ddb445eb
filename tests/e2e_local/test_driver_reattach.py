"""The turn driver against the real harness process: re-attach from the ledger instead of
admitting twice, and a lost conversation as a typed end rather than an endless poll."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral_api.kinds import AdmissionLedger, AgentSpec, SessionSpec
from corral_api.wire import AdmitRequest
from corral_cli import _processes as proc
from corral_cli._localstore import LocalTurnStore
from corral_operator.driver import DriverState, SessionDriver
from corral_operator.wireclient import ConversationLost, WireClient

pytestmark = pytest.mark.timeout(60)

AGENT = AgentSpec.model_validate(
    {"identity": "You fix bugs.", "model": "corral-scripted", "tools": {"allow": ["bash"]}}
)
SESSION = SessionSpec.model_validate(
    {
        "agentRef": "fixer",
        "task": "Say the word.",
        "workspace": {"repo": "unused"},
        "evaluation": {"criteria": {"substring": "BANANA"}, "turnBudget": 2},
    }
)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[str]:
    """A real scripted model and a real harness (no custodian: none is needed here)."""
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "default": [
                    {
                        "text": "Working on it.",
                        "tool_use": {"name": "bash", "input": {"command": "sleep 1"}},
                    },
                    {"text": "The word is BANANA."},
                ]
            }
        )
    )
    parts = proc.Parts(tmp_path / "logs")
    try:
        port = proc.free_port()
        model = parts.start("model", proc.scripted_argv(port, script), proc.base_env(), port)
        await parts.wait_ready(model, "/_requests")
        port = proc.free_port()
        (tmp_path / "ws").mkdir()
        env = proc.base_env() | {
            "CORRAL_HARNESS_ADDR": f"127.0.0.1:{port}",
            "CORRAL_STATE_DIR": str(tmp_path / "harness"),
            "CORRAL_GRANTED_ROOT": str(tmp_path / "ws"),
            "ANTHROPIC_BASE_URL": model.url,
            "ANTHROPIC_API_KEY": "scripted",
        }
        harness = parts.start("harness", proc.part_argv(proc.HARNESS), env, port)
        await parts.wait_ready(harness)
        yield harness.url
    finally:
        parts.stop()


async def test_a_restarted_driver_reattaches_from_its_ledger(harness: str, tmp_path: Path) -> None:
    store = LocalTurnStore(tmp_path / "state")
    async with WireClient(harness, "fixer") as client:
        # A driver admitted turn 1, saved its ledger, and died.
        admitted = await client.admit("c1", AdmitRequest(message=SESSION.task, agent=AGENT))
        await store.save(
            DriverState(
                phase="Running",
                ledger=AdmissionLedger(
                    stream_url=admitted.streamUrl,
                    offset=admitted.offset,
                    submission_id=admitted.submissionId,
                    turn=1,
                ),
            )
        )
        seen: list[dict[str, object]] = []
        outcome = await SessionDriver(client, store, AGENT, SESSION, "c1", seen.append).run()
        history = await client.history("c1")

    assert outcome.phase == "Succeeded" and outcome.turns == 1
    started = [e for e in history.events if e["type"] == "submission_started"]
    assert [e["submissionId"] for e in started] == [admitted.submissionId]
    assert not [e for e in seen if e.get("type") == "admitted"]  # nothing admitted again
    final = await store.load()
    assert final.ledger is None and final.evaluation_turns == 1
    assert final.last_settlement is not None
    assert final.last_settlement.submission_id == admitted.submissionId


async def test_a_ledger_the_harness_does_not_know_fails_the_session(
    harness: str, tmp_path: Path
) -> None:
    store = LocalTurnStore(tmp_path / "state")
    await store.save(
        DriverState(
            phase="Running",
            ledger=AdmissionLedger(
                stream_url="/agents/fixer/gone/updates",
                offset=0,
                submission_id="sub_x",
                turn=1,
            ),
        )
    )
    async with WireClient(harness, "fixer") as client:
        outcome = await SessionDriver(client, store, AGENT, SESSION, "gone").run()
    assert outcome.phase == "Failed"
    assert "lost the conversation" in outcome.message


async def test_a_finished_session_is_not_driven_again(harness: str, tmp_path: Path) -> None:
    store = LocalTurnStore(tmp_path / "state")
    await store.save(DriverState(phase="Succeeded", turns=2, message="done before"))
    async with WireClient(harness, "fixer") as client:
        outcome = await SessionDriver(client, store, AGENT, SESSION, "c2").run()
        with pytest.raises(ConversationLost):  # never admitted
            await client.history("c2")
    assert (outcome.phase, outcome.turns, outcome.message) == ("Succeeded", 2, "done before")


class _LedgerWriteFails(LocalTurnStore):
    """A store whose first ledger save fails, as an API error would between admit and save."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failed = False

    async def save(self, state: DriverState) -> None:
        if state.ledger is not None and not self.failed:
            self.failed = True
            raise RuntimeError("the API server refused the status write")
        await super().save(state)


async def test_a_lost_ledger_write_never_admits_the_turn_twice(
    harness: str, tmp_path: Path
) -> None:
    store = _LedgerWriteFails(tmp_path / "state")
    async with WireClient(harness, "fixer") as client:
        with pytest.raises(RuntimeError, match="refused the status write"):
            await SessionDriver(client, store, AGENT, SESSION, "c3").run()
        # The next reconcile starts from a state with no ledger and admits turn 1 again.
        outcome = await SessionDriver(client, store, AGENT, SESSION, "c3").run()
        history = await client.history("c3")

    assert outcome.phase == "Succeeded" and outcome.turns == 1
    started = [e["submissionId"] for e in history.events if e["type"] == "submission_started"]
    assert len(started) == 1  # one submission ran, though it was admitted twice
