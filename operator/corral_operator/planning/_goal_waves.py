"""What a Goal creates for a wave: its Session's name, its task (the template's, the goal, and
what the last wave taught) and its manifest, owned by the Goal."""

from __future__ import annotations

import hashlib
from typing import Any

from corral_api import API_VERSION
from corral_api.kinds import GoalSpec, GoalWave, LandingCheck

from .. import naming

# Annotations on what a Goal creates: which Goal (a name may not fit a label) and which wave.
GOAL_ANNOTATION = "corral.dev/goal"
WAVE_ANNOTATION = "corral.dev/goal-wave"
_ANSWER_IN_TASK = 2000
_LOG_IN_TASK = 1500
_TASK_LIMIT = 262144
_NAME_LIMIT = 63


def wave_session_name(goal: str, wave: int) -> str:
    """The Session of wave `wave`: `<goal>-wave-<n>`, bounded and still unique per Goal."""
    suffix = f"-wave-{wave}"
    name = f"{goal}{suffix}"
    if len(name) <= _NAME_LIMIT:
        return name
    digest = hashlib.sha256(goal.encode()).hexdigest()[:8]
    room = _NAME_LIMIT - len(suffix) - 9
    return f"{goal[:room].rstrip('-.')}-{digest}{suffix}"


def success_check(spec: GoalSpec) -> LandingCheck:
    """The Goal's success check in the shape Evidence is built from (no egress: none needed)."""
    check = spec.success
    return LandingCheck(name=check.name, command=check.command, image=check.image)


def _clip_end(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


def wave_task(spec: GoalSpec, wave: int, previous: GoalWave | None, learnt: dict[str, Any]) -> str:
    """The task of wave `wave`: the template's, the goal, and what the last wave taught.

    `learnt` carries the previous wave's `answer`, and its Evidence's `exitCode` and `logTail`
    when there was one.
    """
    check = spec.success
    lines = [
        spec.session_template.spec.task.rstrip(),
        "",
        "---",
        f"This is wave {wave} of at most {spec.max_waves} toward a goal: "
        f"{spec.description.strip()}",
        f"The goal is met when the check `{check.name}` passes: `{check.command}` exits 0 in a "
        "fresh checkout of the revision your work is pushed as.",
    ]
    if previous is not None:
        lines += ["", f"Wave {previous.wave} (Session {previous.session}) ended {previous.phase}."]
        answer = learnt.get("answer")
        if answer:
            lines += ["Its final answer ended:", _clip_end(str(answer), _ANSWER_IN_TASK)]
        if previous.revision is None:
            lines.append(f"It pushed nothing to check: {previous.message or 'no revision'}.")
        else:
            exit_code = learnt.get("exitCode")
            code = f" (exit code {exit_code})" if exit_code is not None else ""
            lines.append(
                f"Its revision {previous.revision} was checked: {previous.verdict}{code}. "
                "Your workspace starts from that revision."
            )
            tail = learnt.get("logTail")
            if tail:
                log = _clip_end(str(tail), _LOG_IN_TASK)
                lines += ["The check's output ended with:", "```", log, "```"]
        lines.append("Learn from it and make the check pass.")
    return "\n".join(lines)[:_TASK_LIMIT]


def wave_session(
    goal: dict[str, Any],
    spec: GoalSpec,
    wave: int,
    previous: GoalWave | None,
    learnt: dict[str, Any],
) -> dict[str, Any]:
    """The Session manifest of wave `wave`, owned by the Goal (it goes with the Goal)."""
    md = goal["metadata"]
    session_spec = spec.session_template.spec.wire()
    session_spec["task"] = wave_task(spec, wave, previous, learnt)
    if previous is not None and previous.revision is not None:
        # The work goes on from what the last wave pushed, not from the template's ref again.
        session_spec["workspace"]["ref"] = previous.revision
    return {
        "apiVersion": API_VERSION,
        "kind": "Session",
        "metadata": {
            "name": wave_session_name(str(md["name"]), wave),
            "namespace": md["namespace"],
            "labels": {
                naming.LABEL_GOAL: naming.label_value(str(md["name"])),
                naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
            },
            "annotations": {GOAL_ANNOTATION: str(md["name"]), WAVE_ANNOTATION: str(wave)},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "Goal",
                    "name": md["name"],
                    "uid": md["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": session_spec,
    }
