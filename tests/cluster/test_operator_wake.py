"""The one-shot wake on the real API server: a Session stays open after its accepted turn until
`status.wakeAt`, survives an operator killed while it waits, and is woken exactly once."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from ._operator_fixtures import OperatorHandle, ScriptedModelHandle, agent_doc, session_doc

pytestmark = pytest.mark.timeout(150)

WAKE_MESSAGE = "WAKE-7f3a: look again at the task and finish it."


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _user_texts(request: dict[str, object]) -> list[str]:
    body = request["body"]
    assert isinstance(body, dict)
    return [str(m["content"]) for m in body["messages"] if m["role"] == "user"]


def test_a_wake_fires_once_after_an_operator_killed_while_it_waited(
    operator: OperatorHandle, scripted_model: ScriptedModelHandle, git_repo: Path
) -> None:
    name = f"{operator.namespace}-wake"
    replies = [{"text": "First look done."}, {"text": "Woken: all done now."}]
    scripted_model.load({"conversations": {name: replies}})
    wake = {"afterSeconds": 20, "message": WAKE_MESSAGE}
    operator.apply(agent_doc(), session_doc(name, git_repo, wake=wake))

    waiting = operator.wait_phase(name, {"WaitingForWake", "Succeeded", "Failed"})
    assert waiting["phase"] == "WaitingForWake", waiting
    assert waiting["turns"] == 1 and "finishedAt" not in waiting
    assert waiting["answer"] == "First look done."
    progressing = next(c for c in waiting["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "WaitingForWake" and waiting["wakeAt"] in progressing["message"]
    table = operator.cp.kubectl("get", "session", name, "-n", operator.namespace).stdout
    assert "WAKES" in table.splitlines()[0] and waiting["wakeAt"] in table
    assert len(scripted_model.requests(name)) == 1
    # The pod stays: the session is not over, "done" means "not woken yet".
    assert operator.get("pod", f"corral-{name}") is not None

    operator.kill()
    assert datetime.now(UTC) < _when(waiting["wakeAt"]), "the restart must come before the wake"
    operator.start()

    done = operator.wait_phase(name, {"Succeeded", "Failed"}, timeout=90)
    assert done["phase"] == "Succeeded", done
    assert done["turns"] == 2
    assert _when(done["wokenAt"]) >= _when(waiting["wakeAt"])
    assert done["answer"] == "Woken: all done now."
    requests = scripted_model.requests(name)
    assert len(requests) == 2  # the wake turn was admitted and answered once
    assert sum(WAKE_MESSAGE in text for text in _user_texts(requests[-1])) == 1
    reasons = [e["reason"] for e in operator.events(name)]
    assert reasons.count("TurnAdmitted") == 2, reasons
