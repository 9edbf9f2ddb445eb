"""The driver's judgement after each settlement, as pure functions.

Settlement meanings (seed 004): `completed` means the run returned and the turn is open to be
judged; `ended` means the turn's own pick ended it; `failed` means the run threw; `aborted` means
something else ended it. The evaluation guard (seed 003) judges a completed turn: pass stops the
session, fail gives it another turn with the same agent until the guard's turn budget (or the
agent's turn limit) is spent, and then the session stops as failed.
"""

from __future__ import annotations

from corral_api.freeze import FROZEN_ERROR
from corral_api.kinds import AgentSpec, SessionPhase, SessionSpec
from corral_api.wire import SettledEvent

from ._state import Decision, DriverState, EvaluationResult

_OUTPUT_TAIL = 1500


def needs_evaluation(settled: SettledEvent, pick: str | None) -> bool:
    """Whether the guard judges this settlement (only a turn that ran to its end)."""
    if settled.status == "completed":
        return settled.question is None  # a turn that asked a person is not an answer
    return settled.status == "ended" and _waiting_phase(pick) is None


def evaluate_substring(expected: str, text: str) -> EvaluationResult:
    passed = expected in text
    verdict = "found" if passed else "not found"
    return EvaluationResult(passed, f"substring {expected!r} {verdict} in the answer")


def evaluate_exit(command: str, exit_code: int, output: str, timed_out: bool) -> EvaluationResult:
    tail = output[-_OUTPUT_TAIL:]
    if timed_out:
        return EvaluationResult(False, f"`{command}` timed out", tail)
    verdict = "passed" if exit_code == 0 else "failed"
    return EvaluationResult(exit_code == 0, f"`{command}` {verdict} (exit {exit_code})", tail)


def follow_up_message(evaluation: EvaluationResult, turns_left: int) -> str:
    """The message that opens the next turn after a failed evaluation."""
    lines = [
        f"The check run after your last turn did not pass: {evaluation.summary}.",
    ]
    if evaluation.detail.strip():
        lines += ["Its output ends with:", "```", evaluation.detail.rstrip(), "```"]
    lines.append(f"Keep working on the task until the check passes ({turns_left} turn(s) left).")
    return "\n".join(lines)


def freeze_interrupted(settled: SettledEvent, interrupt_requested: bool) -> bool:
    """Whether a freeze, not the turn itself, ended this settlement: the operator's abort with
    cause `freeze` swept it, or the custodian refused a model call because the session is held
    (which can come first: the custodian reads the freeze on its own)."""
    if settled.status not in ("aborted", "failed"):
        return False
    if settled.error is not None and settled.error.type == FROZEN_ERROR:
        return True
    return interrupt_requested and settled.status == "aborted"


SANDBOX_LOST_ERROR = "sandbox_lost"  # the wire's error type (api/corral_api/wire.py)
# The turn's pod went while it ran: the harness of the Session's new pod settled it when the
# conversation was restored there (`sandbox_lost`), or the pod's own harness did as its pod was
# being deleted (`harness_stopped`). Either way the turn is not its own doing: it is admitted
# again, in a new pod when this one goes (docs/turns.md, "A lost pod").
LOST_ERRORS = (SANDBOX_LOST_ERROR, "harness_stopped")


def sandbox_lost(settled: SettledEvent) -> bool:
    """The turn's pod was lost, or is going, while it ran."""
    return settled.status == "failed" and (
        settled.error is not None and settled.error.type in LOST_ERRORS
    )


def resumed_decision(turn: int, revision: str | None, wip_saved_at: str | None = None) -> Decision:
    """After a lost pod interrupted turn `turn`: admit it again at once in the new pod, with a
    note of what was lost (less when its work in progress, saved at `wip_saved_at`, came back).
    The turn is not counted."""
    where = (
        f"the last revision it delivered ({revision[:12]})"
        if revision
        else "the starting ref (nothing had been delivered)"
    )
    if wip_saved_at:
        lost = (
            f"with the work in progress saved at {wip_saved_at} back in the worktree, "
            "uncommitted: changes made after that, and the results of commands still running, "
            "are gone"
        )
    else:
        lost = "changes made since then, and the results of commands still running, are gone"
    note = (
        "Your previous turn was interrupted: the sandbox pod it ran in was lost. The "
        f"conversation is restored, and the workspace is checked out again at {where}, {lost}. "
        "Check the workspace's state, then continue the task where you left off."
    )
    return Decision(
        "continue", "Running", f"turn {turn} resumes in a new pod after its pod was lost", note
    )


# The abort cause a suspend with suspendMode `now` interrupts the turn in flight with.
SUSPEND_CAUSE = "suspend"


def interrupted_decision(turn: int, cause: str | None = None) -> Decision:
    """After a freeze (or a suspend) interrupted turn `turn`: stop driving, not finished. The
    turn is not counted (no turn limit, no evaluation budget spent); its continuation is
    admitted under the same number once the freeze is lifted (the Session resumed)."""
    if cause == SUSPEND_CAUSE:
        text = f"turn {turn} was interrupted by a suspend; it continues when the Session resumes"
    else:
        text = f"turn {turn} was interrupted by a freeze; it continues when the freeze is lifted"
    return Decision("finish", "Running", text)


def is_interrupted(state: DriverState) -> bool:
    """The last settlement is a turn a freeze interrupted (it was not counted)."""
    last = state.last_settlement
    return last is not None and last.turn > state.turns


def continuation_message(
    state: DriverState, task: str, revision: str | None = None, wip_saved_at: str | None = None
) -> str:
    """The message that continues a turn a freeze, or a lost pod, interrupted."""
    last = state.last_settlement
    if last is not None and (last.error or "").startswith(tuple(f"{e}:" for e in LOST_ERRORS)):
        text = resumed_decision(last.turn, revision, wip_saved_at).follow_up or ""
    elif last is not None and (last.error or "").startswith(f"{SUSPEND_CAUSE}:"):
        text = (
            "Your previous turn was interrupted before it finished: the session was suspended, "
            "and it has now resumed in a new sandbox with the conversation restored and the "
            "workspace at the work the interrupted turn delivered. Results of commands still "
            "running then are gone. Check the workspace's state, then continue the task where "
            "you left off."
        )
    else:
        text = (
            "Your previous turn was interrupted by a freeze before it finished. The freeze is "
            "lifted: continue the task where you left off."
        )
    if state.turns == 0:
        text += f"\n\nThe task:\n{task}"  # the first turn may have stopped before it began
    return text


def _waiting_phase(pick: str | None) -> SessionPhase | None:
    """A pick that hands the session to someone else names the phase it waits in."""
    if pick is None:
        return None
    name = pick.removeprefix("mcp__corral__")
    # `land` ends a turn only when it has just asked for its Approval (no decision yet).
    if "approval" in name or name == "land":
        return "WaitingForHuman"
    if "wait" in name:
        return "WaitingForChildren"
    return None


def decide_after_settlement(
    *,
    state: DriverState,
    settled: SettledEvent,
    agent: AgentSpec,
    session: SessionSpec,
    evaluation: EvaluationResult | None = None,
    abort_requested: bool = False,
    pick: str | None = None,
) -> Decision:
    """Decide what follows a settlement.

    `state` already counts the settled turn (`turns`, and `evaluation_turns` when `evaluation`
    is given). `pick` names the Menu tool whose call ended the turn, when one did.
    """
    turn = state.turns
    error = f"{settled.error.type}: {settled.error.message}" if settled.error else "no error given"
    if settled.status == "aborted":
        if abort_requested:
            return Decision("finish", "Stopped", f"turn {turn} aborted on request")
        return Decision("finish", "Failed", f"turn {turn} was aborted ({error})")
    if settled.status == "failed":
        return Decision("finish", "Failed", f"turn {turn} failed ({error})")
    if abort_requested:
        return Decision("finish", "Stopped", f"stopped on request after turn {turn}")
    if settled.status == "completed" and settled.question is not None:
        return Decision("finish", "WaitingForHuman", f"turn {turn} asks: {settled.question}")
    waiting = _waiting_phase(pick) if settled.status == "ended" else None
    if waiting is not None:
        return Decision("finish", waiting, f"turn {turn} ended by its pick {pick}")

    guard = session.evaluation
    if guard is None:
        return Decision("finish", "Succeeded", f"turn {turn} {settled.status}")
    if evaluation is None:
        raise ValueError("the session has an evaluation guard, but no evaluation was given")
    if evaluation.passed:
        return Decision(
            "finish", "Succeeded", f"evaluation passed on turn {turn}: {evaluation.summary}"
        )
    budget_left = guard.turn_budget - state.evaluation_turns
    limit_left = agent.limits.max_turns - state.turns
    if budget_left <= 0:
        return Decision(
            "finish",
            "Failed",
            f"evaluation failed on turn {turn} and its turn budget of {guard.turn_budget} "
            f"is spent: {evaluation.summary}",
        )
    if limit_left <= 0:
        return Decision(
            "finish",
            "Failed",
            f"evaluation failed on turn {turn} and the agent's limit of "
            f"{agent.limits.max_turns} turns is reached: {evaluation.summary}",
        )
    turns_left = min(budget_left, limit_left)
    return Decision(
        "continue",
        "Running",
        f"evaluation failed on turn {turn}, trying again: {evaluation.summary}",
        follow_up=follow_up_message(evaluation, turns_left),
    )
