"""The Goal planner: waves of Sessions until the success check passes or the waves run out.

Pure: the Goal, the Sessions it started and the namespace's Evidence for its check in; the
status, what to create and the Events out. Everything it decides is derived from what it is
given, so a restarted operator (or a second pass over the same objects) plans the same thing:

- no wave yet: start wave 1, a Session from `spec.sessionTemplate`;
- the current wave's Session still runs: wait;
- it ended and `status.delivery.revision` names what it pushed: run the success check there as
  Evidence (one per check definition, revision and repository; an existing one is reused);
- the Evidence says Pass: the Goal is Met; Fail or Error (or nothing was pushed to check): the
  next wave starts, its task carrying the last answer and verdict, until `maxWaves`, then Failed.

docs/goals.md describes the whole cycle.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from corral_api import API_VERSION
from corral_api.evidence import evidence_counts
from corral_api.kinds import Goal, GoalSpec, GoalStatus, GoalWave, LandingCheck, WaveVerdict

from .. import naming
from .conditions import set_condition
from .evidence_request import EvidenceWanted, build_evidence
from .session import FINAL, PlannedEvent, parse_time

# Annotations on what a Goal creates: which Goal (a name may not fit a label) and which wave.
GOAL_ANNOTATION = "corral.dev/goal"
WAVE_ANNOTATION = "corral.dev/goal-wave"
# Events on the Goal's Sessions and Evidence wake it at once; this is the fallback.
GOAL_RECHECK = 15.0
# A Session that ended without a delivery record: how long its record may still be on its way.
DELIVERY_GRACE_SECONDS = 30.0
_ANSWER_IN_TASK = 2000
_LOG_IN_TASK = 1500
_TASK_LIMIT = 262144
_NAME_LIMIT = 63

# Goal condition reasons (docs/vocabulary.md, "Goal condition reasons").
ACCEPTED = "Accepted"
INVALID_SPEC = "InvalidSpec"
WAVE_RUNNING = "WaveRunning"
CHECKING_WAVE = "CheckingWave"
GOAL_MET = "GoalMet"
WAVES_EXHAUSTED = "WavesExhausted"


@dataclass(frozen=True)
class GoalPlan:
    status: dict[str, Any]
    changed: bool
    # Objects to create (a wave's Session, a wave's Evidence); one that exists already is fine.
    create: list[dict[str, Any]] = field(default_factory=list)
    events: list[PlannedEvent] = field(default_factory=list)
    # None: the Goal is settled (Met, Failed, or an invalid spec); nothing to come back for.
    requeue_after: float | None = GOAL_RECHECK


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


_VERDICTS: dict[str, WaveVerdict] = {"Pass": "Pass", "Fail": "Fail", "Error": "Error"}


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("kind") == "Goal" and r.get("uid") == uid for r in refs)


def _revision(session: dict[str, Any]) -> tuple[str | None, str]:
    """The revision a finished Session pushed, and what its delivery record says."""
    delivery = (session.get("status") or {}).get("delivery") or {}
    revision = delivery.get("revision")
    said = str(delivery.get("message") or delivery.get("state") or "no delivery recorded")
    return (str(revision) if revision else None), said


def plan_goal(
    body: dict[str, Any],
    sessions: list[dict[str, Any]],
    evidences: list[dict[str, Any]],
    now: datetime,
) -> GoalPlan:
    """Decide the Goal's status and what to create next.

    `sessions` are the Sessions labelled with this Goal (only those it owns count); `evidences`
    the namespace's Evidence for its success check (any that speaks about exactly the check's
    definition, the revision and the repository counts, whoever asked for it).
    """
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    md = body.get("metadata") or {}
    generation = int(md.get("generation") or 0)
    old = GoalStatus.model_validate(body.get("status") or {})
    status = old.model_copy(deep=True)
    events: list[PlannedEvent] = []

    def condition(type_: str, value: Literal["True", "False"], reason: str, text: str) -> None:
        status.conditions = set_condition(
            status.conditions, type_, value, reason, text, now=stamp, generation=generation
        )

    def done(
        create: list[dict[str, Any]] | None = None, requeue: float | None = GOAL_RECHECK
    ) -> GoalPlan:
        status.observed_generation = generation
        new = status.wire()
        return GoalPlan(new, new != old.wire(), create or [], events, requeue)

    try:
        goal = Goal.model_validate({k: body.get(k) for k in ("metadata", "spec")})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        condition("Ready", "False", INVALID_SPEC, f"{where}: {first['msg']}")
        return done(requeue=None)
    spec = goal.spec
    condition("Ready", "True", ACCEPTED, "the goal's spec is valid")
    if old.verdict in ("Met", "Failed"):
        return done(requeue=None)  # settled: its history stays as it was

    uid = str(md.get("uid", ""))
    owned = {
        str(s["metadata"]["name"]): s for s in sessions if _owned_by(s, uid) and s.get("metadata")
    }

    def start_wave(wave: int, previous: GoalWave | None, learnt: dict[str, Any]) -> GoalPlan:
        manifest = wave_session(body, spec, wave, previous, learnt)
        name = manifest["metadata"]["name"]
        status.history.append(GoalWave(wave=wave, session=name))
        status.waves = wave
        status.sessions = [*status.sessions, name]
        status.session = name
        status.message = f"wave {wave} of {spec.max_waves}: Session {name} started"
        condition("Progressing", "True", WAVE_RUNNING, status.message)
        events.append(PlannedEvent("Normal", "WaveStarted", status.message))
        return done([manifest])

    if not status.history:
        return start_wave(1, None, {})

    current = status.history[-1]
    session = owned.get(current.session)
    if session is None:
        # Just created (the list may not show it yet) or removed by hand: create it again; an
        # existing one is left alone, so this never starts a wave twice.
        previous = status.history[-2] if len(status.history) > 1 else None
        manifest = wave_session(body, spec, current.wave, previous, {})
        return done([manifest])
    phase = str((session.get("status") or {}).get("phase") or "Pending")
    current.phase = phase
    if phase not in FINAL:
        status.message = (
            f"wave {current.wave} of {spec.max_waves}: Session {current.session} is {phase}"
        )
        condition("Progressing", "True", WAVE_RUNNING, status.message)
        return done()

    answer = (session.get("status") or {}).get("answer") or (session.get("status") or {}).get(
        "message"
    )
    learnt: dict[str, Any] = {"answer": answer}
    revision, said = _revision(session)
    if revision is None:
        finished = parse_time((session.get("status") or {}).get("finishedAt")) or now
        waited = (now - finished).total_seconds()
        no_record = not (session.get("status") or {}).get("delivery")
        if no_record and phase == "Succeeded" and waited < DELIVERY_GRACE_SECONDS:
            status.message = (
                f"wave {current.wave}: waiting for Session {current.session}'s delivery"
            )
            condition("Progressing", "True", WAVE_RUNNING, status.message)
            return done(requeue=max(DELIVERY_GRACE_SECONDS - waited, 1.0))
        current.verdict = "NoRevision"
        current.message = f"Session {current.session} ended {phase} and pushed nothing: {said}"
    else:
        current.revision = revision
        status.revision = revision
        check = success_check(spec)
        repo = spec.session_template.spec.workspace.repo
        wanted = EvidenceWanted(
            namespace=str(md.get("namespace")), check=check, repo=repo, revision=revision
        )
        found = next(
            (
                e
                for e in evidences
                if evidence_counts(
                    e, check.name, revision, repo, wanted.digest, namespace=wanted.namespace
                )
            ),
            None,
        )
        if found is None:
            manifest = build_evidence(wanted)
            manifest["metadata"]["labels"][naming.LABEL_GOAL] = naming.label_value(str(md["name"]))
            annotations = manifest["metadata"].setdefault("annotations", {})
            annotations[GOAL_ANNOTATION] = str(md["name"])
            annotations[WAVE_ANNOTATION] = str(current.wave)
            current.evidence = manifest["metadata"]["name"]
            current.verdict = "Pending"
            status.message = (
                f"wave {current.wave}: checking {revision[:12]} with `{check.name}` "
                f"(Evidence {current.evidence})"
            )
            condition("Progressing", "True", CHECKING_WAVE, status.message)
            events.append(PlannedEvent("Normal", "WaveChecking", status.message))
            return done([manifest])
        current.evidence = str(found["metadata"]["name"])
        ev_status = found.get("status") or {}
        verdict = _VERDICTS.get(str(ev_status.get("verdict")))
        if verdict is None:  # still running
            current.verdict = "Pending"
            status.message = (
                f"wave {current.wave}: checking {revision[:12]} with `{check.name}` "
                f"(Evidence {current.evidence})"
            )
            condition("Progressing", "True", CHECKING_WAVE, status.message)
            return done()
        current.verdict = verdict
        learnt["exitCode"] = ev_status.get("exitCode")
        learnt["logTail"] = ev_status.get("logTail")
        current.message = f"`{check.name}` at {revision[:12]}: {verdict}"
        if verdict == "Pass":
            status.verdict = "Met"
            status.message = f"met in wave {current.wave}: {current.message}"
            condition("Progressing", "False", GOAL_MET, status.message)
            condition("Met", "True", GOAL_MET, status.message)
            events.append(PlannedEvent("Normal", "GoalMet", status.message))
            return done(requeue=None)

    events.append(PlannedEvent("Warning", "WaveFailed", f"wave {current.wave}: {current.message}"))
    if current.wave >= spec.max_waves:
        status.verdict = "Failed"
        status.message = (
            f"not met after {current.wave} wave(s) (maxWaves {spec.max_waves}): {current.message}"
        )
        condition("Progressing", "False", WAVES_EXHAUSTED, status.message)
        condition("Met", "False", WAVES_EXHAUSTED, status.message)
        events.append(PlannedEvent("Warning", "GoalFailed", status.message))
        return done(requeue=None)
    return start_wave(current.wave + 1, current, learnt)
