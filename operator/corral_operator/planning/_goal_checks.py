"""The Goal planner's checks, in the order it decides them: each reads one `GoalInputs` and
returns a `GoalDecision`, or None to let the next check decide; the first decision wins, and a
wave that ended short of the goal with waves left is followed by the next (`steady_state`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

from pydantic import ValidationError

from corral_api.evidence import evidence_counts
from corral_api.kinds import (
    FINAL_PHASES,
    Goal,
    GoalSpec,
    GoalStatus,
    GoalWave,
    LandingCheck,
    WaveVerdict,
)

from .. import naming
from ._goal_waves import GOAL_ANNOTATION, WAVE_ANNOTATION, success_check, wave_session
from ._validated import validated
from .conditions import set_condition
from .evidence_request import EvidenceWanted, build_evidence
from .session import PlannedEvent, parse_time

# Events on the Goal's Sessions and Evidence wake it at once; this is the fallback.
GOAL_RECHECK = 15.0
# A Session that ended without a delivery record: how long its record may still be on its way.
DELIVERY_GRACE_SECONDS = 30.0

# Goal condition reasons (docs/vocabulary.md, "Goal condition reasons").
ACCEPTED = "Accepted"
INVALID_SPEC = "InvalidSpec"
WAVE_RUNNING = "WaveRunning"
CHECKING_WAVE = "CheckingWave"
GOAL_MET = "GoalMet"
WAVES_EXHAUSTED = "WavesExhausted"

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


def _with_condition(
    inputs: GoalInputs,
    status: GoalStatus,
    type_: str,
    value: Literal["True", "False"],
    reason: str,
    text: str,
) -> GoalStatus:
    now, generation = inputs.stamp, inputs.generation
    conditions = set_condition(
        status.conditions, type_, value, reason, text, now=now, generation=generation
    )
    return status.model_copy(update={"conditions": conditions})


def _with_current(status: GoalStatus, **update: Any) -> GoalStatus:
    """`status` with its current (last) wave updated."""
    current = status.history[-1].model_copy(update=update)
    return status.model_copy(update={"history": [*status.history[:-1], current]})


@dataclass(frozen=True)
class GoalInputs:
    """Everything `plan_goal` is given (its parameters, by the same names), and what is read
    off it, each read once, when a check first asks.

    A read may assume that the checks before the first one that asks for it passed: `spec` is
    there once the spec is valid, `current` once a wave started, `phase` once its Session is
    found, `wanted` and `found` once it pushed a revision.
    """

    body: dict[str, Any]
    sessions: list[dict[str, Any]]
    evidences: list[dict[str, Any]]
    now: datetime

    @cached_property
    def stamp(self) -> str:
        return self.now.strftime("%Y-%m-%dT%H:%M:%SZ")

    @cached_property
    def metadata(self) -> dict[str, Any]:
        md: dict[str, Any] = self.body.get("metadata") or {}
        return md

    @cached_property
    def generation(self) -> int:
        return int(self.metadata.get("generation") or 0)

    @cached_property
    def old(self) -> GoalStatus:
        """The status as the Goal carries it now."""
        return GoalStatus.model_validate(self.body.get("status") or {})

    @cached_property
    def parsed(self) -> Goal | ValidationError:
        """The Goal's metadata and spec, validated, or why they do not validate."""
        return validated(Goal, self.body)

    @property
    def spec(self) -> GoalSpec:
        parsed = self.parsed
        if isinstance(parsed, ValidationError):
            raise parsed
        return parsed.spec

    @cached_property
    def accepted(self) -> GoalStatus:
        """The status with Ready saying the spec is valid."""
        return _with_condition(
            self, self.old, "Ready", "True", ACCEPTED, "the goal's spec is valid"
        )

    @cached_property
    def current(self) -> GoalWave:
        """The current (last) wave."""
        return self.old.history[-1]

    @cached_property
    def wave_session(self) -> dict[str, Any] | None:
        """The current wave's Session, when it is there and the Goal owns it."""
        uid = str(self.metadata.get("uid", ""))
        owned = {
            str(s["metadata"]["name"]): s
            for s in self.sessions
            if _owned_by(s, uid) and s.get("metadata")
        }
        return owned.get(self.current.session)

    @cached_property
    def wave_status(self) -> dict[str, Any]:
        assert self.wave_session is not None, "a missing wave Session is decided before"
        status: dict[str, Any] = self.wave_session.get("status") or {}
        return status

    @cached_property
    def phase(self) -> str:
        return str(self.wave_status.get("phase") or "Pending")

    @cached_property
    def seen(self) -> GoalStatus:
        """The accepted status with the phase of the current wave's Session."""
        return _with_current(self.accepted, phase=self.phase)

    @cached_property
    def delivery(self) -> tuple[str | None, str]:
        """The revision the wave's Session pushed, and what its delivery record says."""
        assert self.wave_session is not None, "a missing wave Session is decided before"
        return _revision(self.wave_session)

    @property
    def revision(self) -> str | None:
        return self.delivery[0]

    @cached_property
    def check(self) -> LandingCheck:
        return success_check(self.spec)

    @cached_property
    def wanted(self) -> EvidenceWanted:
        """The Evidence the success check needs at the wave's revision."""
        assert self.revision is not None, "a wave that pushed nothing is decided before"
        return EvidenceWanted(
            namespace=str(self.metadata.get("namespace")),
            check=self.check,
            repo=self.spec.session_template.spec.workspace.repo,
            revision=self.revision,
        )

    @cached_property
    def found(self) -> dict[str, Any] | None:
        """An Evidence that counts for the check at the revision, whoever asked for it."""
        wanted = self.wanted
        return next(
            (
                e
                for e in self.evidences
                if evidence_counts(
                    e,
                    wanted.check.name,
                    wanted.revision,
                    wanted.repo,
                    wanted.digest,
                    namespace=wanted.namespace,
                )
            ),
            None,
        )

    @cached_property
    def evidence_status(self) -> dict[str, Any]:
        assert self.found is not None, "a check not started is decided before"
        status: dict[str, Any] = self.found.get("status") or {}
        return status

    @cached_property
    def verdict(self) -> WaveVerdict | None:
        """The Evidence's verdict; None while it runs."""
        return _VERDICTS.get(str(self.evidence_status.get("verdict")))


@dataclass(frozen=True)
class GoalDecision:
    """What a check decided: the status, the reason of the condition it set (None: it set none
    besides Ready Accepted), what to create, the Events, and when to come back."""

    status: GoalStatus
    reason: str | None = None
    # Objects to create (a wave's Session, a wave's Evidence); one that exists already is fine.
    create: tuple[dict[str, Any], ...] = ()
    events: tuple[PlannedEvent, ...] = ()
    # None: the Goal is settled (Met, Failed, or an invalid spec); nothing to come back for.
    requeue_after: float | None = GOAL_RECHECK


GoalCheck = Callable[[GoalInputs], GoalDecision | None]


def _start_wave(
    inputs: GoalInputs,
    status: GoalStatus,
    wave: int,
    previous: GoalWave | None,
    learnt: dict[str, Any],
    events: tuple[PlannedEvent, ...] = (),
) -> GoalDecision:
    """Wave `wave` starts: its Session is created, and the status and an Event say so."""
    spec = inputs.spec
    manifest = wave_session(inputs.body, spec, wave, previous, learnt)
    name = manifest["metadata"]["name"]
    message = f"wave {wave} of {spec.max_waves}: Session {name} started"
    status = status.model_copy(
        update={
            "history": [*status.history, GoalWave(wave=wave, session=name)],
            "waves": wave,
            "sessions": [*status.sessions, name],
            "session": name,
            "message": message,
        }
    )
    status = _with_condition(inputs, status, "Progressing", "True", WAVE_RUNNING, message)
    started = PlannedEvent("Normal", "WaveStarted", message)
    return GoalDecision(status, WAVE_RUNNING, create=(manifest,), events=(*events, started))


def _checking(inputs: GoalInputs, evidence: str) -> GoalStatus:
    """The status while the success check runs as Evidence `evidence` at the wave's revision."""
    current, revision = inputs.current, inputs.revision
    assert revision is not None
    message = (
        f"wave {current.wave}: checking {revision[:12]} with `{inputs.check.name}` "
        f"(Evidence {evidence})"
    )
    status = _with_current(inputs.seen, revision=revision, evidence=evidence, verdict="Pending")
    status = status.model_copy(update={"revision": revision, "message": message})
    return _with_condition(inputs, status, "Progressing", "True", CHECKING_WAVE, message)


def _wave_outcome(inputs: GoalInputs) -> GoalStatus:
    """The status with how the current wave ended: nothing pushed to check (NoRevision), or the
    verdict of the check at what it pushed."""
    current, revision = inputs.current, inputs.revision
    if revision is None:
        said = inputs.delivery[1]
        message = f"Session {current.session} ended {inputs.phase} and pushed nothing: {said}"
        return _with_current(inputs.seen, verdict="NoRevision", message=message)
    assert inputs.found is not None and inputs.verdict is not None, "decided before"
    status = _with_current(
        inputs.seen,
        revision=revision,
        evidence=str(inputs.found["metadata"]["name"]),
        verdict=inputs.verdict,
        message=f"`{inputs.check.name}` at {revision[:12]}: {inputs.verdict}",
    )
    return status.model_copy(update={"revision": revision})


def _learnt(inputs: GoalInputs) -> dict[str, Any]:
    """What the next wave's task carries from this one: its answer, and the check's exit code
    and output when it ran."""
    answer = inputs.wave_status.get("answer") or inputs.wave_status.get("message")
    learnt: dict[str, Any] = {"answer": answer}
    if inputs.revision is not None:
        learnt["exitCode"] = inputs.evidence_status.get("exitCode")
        learnt["logTail"] = inputs.evidence_status.get("logTail")
    return learnt


def _wave_failed(wave: GoalWave) -> PlannedEvent:
    return PlannedEvent("Warning", "WaveFailed", f"wave {wave.wave}: {wave.message}")


def spec_invalid(inputs: GoalInputs) -> GoalDecision | None:
    """The Goal's spec does not validate: Ready False (InvalidSpec), and nothing to come back
    for until it changes."""
    parsed = inputs.parsed
    if not isinstance(parsed, ValidationError):
        return None
    first = parsed.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    text = f"{where}: {first['msg']}"
    status = _with_condition(inputs, inputs.old, "Ready", "False", INVALID_SPEC, text)
    return GoalDecision(status, INVALID_SPEC, requeue_after=None)


def settled(inputs: GoalInputs) -> GoalDecision | None:
    """The Goal is Met or Failed: its history stays as it was."""
    if inputs.old.verdict not in ("Met", "Failed"):
        return None
    return GoalDecision(inputs.accepted, requeue_after=None)


def first_wave(inputs: GoalInputs) -> GoalDecision | None:
    """No wave yet: wave 1 starts (WaveRunning)."""
    if inputs.old.history:
        return None
    return _start_wave(inputs, inputs.accepted, 1, None, {})


def wave_session_missing(inputs: GoalInputs) -> GoalDecision | None:
    """The current wave's Session is not there: just created (the list may not show it yet) or
    removed by hand. Create it again; an existing one is left alone, so this never starts a
    wave twice."""
    if inputs.wave_session is not None:
        return None
    history = inputs.old.history
    previous = history[-2] if len(history) > 1 else None
    manifest = wave_session(inputs.body, inputs.spec, inputs.current.wave, previous, {})
    return GoalDecision(inputs.accepted, create=(manifest,))


def wave_running(inputs: GoalInputs) -> GoalDecision | None:
    """The current wave's Session still runs: wait (WaveRunning)."""
    phase = inputs.phase
    if phase in FINAL_PHASES:
        return None
    current = inputs.current
    message = (
        f"wave {current.wave} of {inputs.spec.max_waves}: Session {current.session} is {phase}"
    )
    status = inputs.seen.model_copy(update={"message": message})
    status = _with_condition(inputs, status, "Progressing", "True", WAVE_RUNNING, message)
    return GoalDecision(status, WAVE_RUNNING)


def delivery_on_its_way(inputs: GoalInputs) -> GoalDecision | None:
    """The wave's Session succeeded a moment ago with no delivery record yet: the record may
    still be on its way; wait out the grace (WaveRunning)."""
    if inputs.revision is not None or inputs.wave_status.get("delivery"):
        return None
    finished = parse_time(inputs.wave_status.get("finishedAt")) or inputs.now
    waited = (inputs.now - finished).total_seconds()
    if inputs.phase != "Succeeded" or waited >= DELIVERY_GRACE_SECONDS:
        return None
    current = inputs.current
    message = f"wave {current.wave}: waiting for Session {current.session}'s delivery"
    status = inputs.seen.model_copy(update={"message": message})
    status = _with_condition(inputs, status, "Progressing", "True", WAVE_RUNNING, message)
    return GoalDecision(
        status, WAVE_RUNNING, requeue_after=max(DELIVERY_GRACE_SECONDS - waited, 1.0)
    )


def check_not_started(inputs: GoalInputs) -> GoalDecision | None:
    """The wave pushed a revision and no Evidence of the success check there counts yet: create
    one (CheckingWave)."""
    if inputs.revision is None or inputs.found is not None:
        return None
    goal = str(inputs.metadata["name"])
    manifest = build_evidence(inputs.wanted)
    manifest["metadata"]["labels"][naming.LABEL_GOAL] = naming.label_value(goal)
    annotations = manifest["metadata"].setdefault("annotations", {})
    annotations[GOAL_ANNOTATION] = goal
    annotations[WAVE_ANNOTATION] = str(inputs.current.wave)
    status = _checking(inputs, manifest["metadata"]["name"])
    checking = PlannedEvent("Normal", "WaveChecking", status.message or "")
    return GoalDecision(status, CHECKING_WAVE, create=(manifest,), events=(checking,))


def check_running(inputs: GoalInputs) -> GoalDecision | None:
    """The success check's Evidence has no verdict yet: wait (CheckingWave)."""
    if inputs.revision is None or inputs.found is None or inputs.verdict is not None:
        return None
    status = _checking(inputs, str(inputs.found["metadata"]["name"]))
    return GoalDecision(status, CHECKING_WAVE)


def goal_met(inputs: GoalInputs) -> GoalDecision | None:
    """The success check passed at the wave's revision: the Goal is Met (GoalMet)."""
    if inputs.revision is None or inputs.verdict != "Pass":
        return None
    status = _wave_outcome(inputs)
    current = status.history[-1]
    message = f"met in wave {current.wave}: {current.message}"
    status = status.model_copy(update={"verdict": "Met", "message": message})
    status = _with_condition(inputs, status, "Progressing", "False", GOAL_MET, message)
    status = _with_condition(inputs, status, "Met", "True", GOAL_MET, message)
    met = PlannedEvent("Normal", "GoalMet", message)
    return GoalDecision(status, GOAL_MET, events=(met,), requeue_after=None)


def waves_exhausted(inputs: GoalInputs) -> GoalDecision | None:
    """The wave ended short of the goal and it was the last one allowed: the Goal is Failed
    (WavesExhausted)."""
    if inputs.current.wave < inputs.spec.max_waves:
        return None
    status = _wave_outcome(inputs)
    current = status.history[-1]
    message = (
        f"not met after {current.wave} wave(s) (maxWaves {inputs.spec.max_waves}): "
        f"{current.message}"
    )
    status = status.model_copy(update={"verdict": "Failed", "message": message})
    status = _with_condition(inputs, status, "Progressing", "False", WAVES_EXHAUSTED, message)
    status = _with_condition(inputs, status, "Met", "False", WAVES_EXHAUSTED, message)
    failed = (_wave_failed(current), PlannedEvent("Warning", "GoalFailed", message))
    return GoalDecision(status, WAVES_EXHAUSTED, events=failed, requeue_after=None)


def steady_state(inputs: GoalInputs) -> GoalDecision:
    """The wave ended short of the goal with waves left: the next one starts, its task carrying
    what this one taught (WaveRunning)."""
    status = _wave_outcome(inputs)
    current = status.history[-1]
    return _start_wave(
        inputs, status, current.wave + 1, current, _learnt(inputs), (_wave_failed(current),)
    )


# The order is the planner's: each check may assume that those before it passed.
GOAL_CHECKS: tuple[GoalCheck, ...] = (
    spec_invalid,
    settled,
    first_wave,
    wave_session_missing,
    wave_running,
    delivery_on_its_way,
    check_not_started,
    check_running,
    goal_met,
    waves_exhausted,
)


def decide_goal(inputs: GoalInputs) -> GoalDecision:
    """The first decision of the chain, or the next wave when no check decides."""
    for check in GOAL_CHECKS:
        decision = check(inputs)
        if decision is not None:
            return decision
    return steady_state(inputs)
