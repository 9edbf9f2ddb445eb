"""The approval desk answers the harness's file approvals (the harness's own FileApprovalPort,
the real local approval store, waits on the other side)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from corral_api.kinds import AgentSpec
from corral_cli._approvals import ApprovalDesk, default_mode
from corral_harness.approvals.file_port import FileApprovalPort
from corral_harness.ports import ToolCall, TurnContext

pytestmark = pytest.mark.timeout(10)

CALL = ToolCall("t1", "bash", {"command": "git merge main"})


def context(root: Path) -> TurnContext:
    return TurnContext(
        conversation="c1",
        submission_id="s1",
        agent=AgentSpec(identity="x", model="corral-scripted"),
        model="corral-scripted",
        thinking_level="medium",
        granted_root=root,
        read_only=False,
        context_window=1000,
        max_output_tokens=100,
    )


async def ask_once(
    tmp_path: Path, mode: str, prompt_answer: str = ""
) -> tuple[str, list[str], list[str]]:
    port = FileApprovalPort(tmp_path / "approvals", poll_seconds=0.01)
    approval_id = await port.request(context(tmp_path), CALL, "git merge needs a human")
    notes: list[str] = []
    questions: list[str] = []

    def prompt(question: str) -> str:
        questions.append(question)
        return prompt_answer

    desk = ApprovalDesk(tmp_path / "approvals", mode, notes.append, prompt)  # type: ignore[arg-type]
    desk.on_event(
        {
            "offset": 3,
            "type": "approval_requested",
            "submissionId": "s1",
            "approvalId": approval_id,
            "toolUseId": "t1",
            "name": "bash",
        }
    )
    if mode == "manual":
        return "", notes, questions
    verdict = await asyncio.wait_for(port.wait(approval_id), 5)
    return verdict, notes, questions


@pytest.mark.parametrize(("mode", "verdict"), [("approve", "approved"), ("deny", "denied")])
async def test_fixed_modes_decide_at_once(tmp_path: Path, mode: str, verdict: str) -> None:
    decided, notes, questions = await ask_once(tmp_path, mode)
    assert decided == verdict and not questions
    assert f"{verdict} (--approvals {mode}): bash " in notes[0]
    assert "git merge needs a human" in notes[0]


@pytest.mark.parametrize(
    ("answer", "verdict"), [("y", "approved"), ("yes", "approved"), ("", "denied"), ("n", "denied")]
)
async def test_ask_mode_puts_the_call_to_a_person(
    tmp_path: Path, answer: str, verdict: str
) -> None:
    decided, notes, questions = await ask_once(tmp_path, "ask", answer)
    assert decided == verdict
    assert questions == [
        'approve bash {"command": "git merge main"} (git merge needs a human)? [y/N] '
    ]
    await asyncio.sleep(0)
    assert notes[-1].endswith(verdict)


async def test_manual_mode_says_where_to_decide_and_leaves_it_open(tmp_path: Path) -> None:
    _, notes, _ = await ask_once(tmp_path, "manual")
    path = next((tmp_path / "approvals").glob("*.json"))
    assert str(path) in notes[0]
    assert json.loads(path.read_text())["decision"] is None


async def test_a_decided_approval_read_again_is_left_alone(tmp_path: Path) -> None:
    decided, _, _ = await ask_once(tmp_path, "deny")
    path = next((tmp_path / "approvals").glob("*.json"))
    notes: list[str] = []
    desk = ApprovalDesk(tmp_path / "approvals", "approve", notes.append)
    desk.on_event({"type": "approval_requested", "approvalId": path.stem})
    assert decided == "denied" and json.loads(path.read_text())["decision"] == "denied"
    assert not notes


def test_without_a_terminal_the_default_is_to_deny() -> None:
    # Under pytest stdin is not a terminal.
    assert default_mode(json_lines=False) == "deny"
    assert default_mode(json_lines=True) == "deny"
