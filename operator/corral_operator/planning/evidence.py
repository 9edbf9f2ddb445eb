"""The Evidence planner: start the check pod, then read its verdict from the pod's status.

An Evidence whose `spec.definitionDigest` is not the digest of the command and image it names
is an Error and never runs: its verdict would be bound to a definition it did not run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from corral_api.digest import check_definition_digest
from corral_api.kinds import Evidence, EvidenceStatus

from .. import naming
from ..naming import CHECK_CONTAINER
from .conditions import set_condition
from .session import PlannedEvent

_LOG_LIMIT = 16384


@dataclass(frozen=True)
class EvidencePlan:
    status: dict[str, Any]
    changed: bool
    create_pod: bool = False
    # The pod finished: read its log for the tail, then delete it.
    finished: bool = False


def _terminated(pod: dict[str, Any], init: bool) -> dict[str, Any] | None:
    key = "initContainerStatuses" if init else "containerStatuses"
    for cs in (pod.get("status") or {}).get(key) or []:
        if init or cs.get("name") == CHECK_CONTAINER:
            term = (cs.get("state") or {}).get("terminated")
            if term is not None and (not init or term.get("exitCode") != 0):
                return dict(term)
    return None


def plan_evidence(
    body: dict[str, Any],
    pod: dict[str, Any] | None,
    now: str,
    log_tail: str | None = None,
    refusal: str | None = None,
) -> EvidencePlan:
    """`refusal`: why its pod cannot be built (e.g. a repository a cluster cannot clone)."""
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    old = EvidenceStatus.model_validate(body.get("status") or {})
    status = old
    create = finished = False
    if old.verdict != "Pending":
        pass  # a verdict is final: the revision and the command cannot change
    else:
        problem = _spec_problem(body)
        if problem is None and pod is None and refusal is not None:
            problem = refusal
        if problem is not None:
            status = old.model_copy(
                update={"verdict": "Error", "finished": now, "log_tail": problem[-_LOG_LIMIT:]}
            )
        else:
            if pod is None:
                create = True
                status = old.model_copy(
                    update={"started": old.started or now, "pod_name": _pod_name(body)}
                )
            else:
                status, finished = _from_pod(old, pod, now, log_tail)
    verdict = status.verdict
    state = {"Pending": "Unknown", "Pass": "True", "Fail": "False", "Error": "False"}[verdict]
    reason = {"Pending": "Running", "Pass": "Passed", "Fail": "Failed", "Error": "Error"}[verdict]
    conds = set_condition(
        status.conditions,
        "Ready",
        state,  # type: ignore[arg-type]
        reason,
        f"exit code {status.exit_code}" if status.exit_code is not None else verdict,
        now=now,
        generation=generation,
    )
    status = status.model_copy(update={"conditions": conds, "observed_generation": generation})
    new = status.wire()
    return EvidencePlan(new, new != old.wire(), create, finished)


def _spec_problem(body: dict[str, Any]) -> str | None:
    try:
        evidence = Evidence.model_validate({k: body.get(k) for k in ("metadata", "spec")})
    except ValidationError as exc:
        return f"invalid spec: {exc}"
    spec = evidence.spec
    expected = check_definition_digest(spec.command, spec.image)
    if spec.definition_digest is not None and spec.definition_digest != expected:
        return (
            f"spec.definitionDigest {spec.definition_digest} is not the digest of this command "
            f"and image ({expected}); the check is not run"
        )
    return None


def _pod_name(body: dict[str, Any]) -> str:
    return naming.evidence_pod_name(str(body["metadata"]["name"]))


def _from_pod(
    old: EvidenceStatus, pod: dict[str, Any], now: str, log_tail: str | None
) -> tuple[EvidenceStatus, bool]:
    init_failed = _terminated(pod, init=True)
    if init_failed is not None:
        tail = log_tail or init_failed.get("message") or "the checkout failed"
        return old.model_copy(
            update={
                "verdict": "Error",
                "exit_code": init_failed.get("exitCode"),
                "finished": now,
                "log_tail": tail[-_LOG_LIMIT:],
            }
        ), True
    term = _terminated(pod, init=False)
    pod_status = pod.get("status") or {}
    if pod_status.get("phase") == "Failed" and pod_status.get("reason") == "DeadlineExceeded":
        message = str(pod_status.get("message") or "the check ran past its deadline")
        return old.model_copy(
            update={
                "verdict": "Error",
                "exit_code": term.get("exitCode") if term else None,
                "finished": now,
                "log_tail": ((log_tail or "") + "\n" + message).strip()[-_LOG_LIMIT:],
            }
        ), True
    if term is None:
        return old, False
    code = int(term.get("exitCode", -1))
    tail = log_tail if log_tail is not None else str(term.get("message") or "")
    return old.model_copy(
        update={
            "verdict": "Pass" if code == 0 else "Fail",
            "exit_code": code,
            "finished": term.get("finishedAt") or now,
            "log_tail": tail[-_LOG_LIMIT:],
        }
    ), True


def verdict_on_session(evidence: dict[str, Any], verdict: str) -> PlannedEvent:
    """The Event on the Session an Evidence was run for: reason `Evidence<Verdict>`."""
    spec = evidence.get("spec") or {}
    name = evidence.get("metadata", {}).get("name")
    return PlannedEvent(
        "Normal" if verdict == "Pass" else "Warning",
        f"Evidence{verdict}",
        f"Evidence {name}: check {spec.get('check')!r} at "
        f"{str(spec.get('revision', ''))[:12]}: {verdict}",
    )
