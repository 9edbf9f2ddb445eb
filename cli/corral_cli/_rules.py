"""The CRDs' cross-field CEL rules, re-stated for local validation.

The rules themselves live on the models in `corral_api.kinds` (as `x-kubernetes-validations`)
and the API server evaluates them there; this module checks the same conditions in Python for
`corral run`, and words each failure as the API server does: the rule's field path, `Invalid
value: "object"`, and the rule's own message. Transition rules (`oldSelf`) do not apply to a
new object and are skipped. `tests/unit/cli` checks that every message here is one of the CRDs'.
"""

from __future__ import annotations

import re

from corral_api import Agent, Session
from corral_api._base import Resource
from corral_api.kinds import (
    BRANCH_MESSAGE,
    BRANCH_PATTERN_MESSAGE,
    LANDING_TARGETS_MESSAGE,
    EvaluationCriteria,
    SessionSpec,
    Workspace,
)

_BRANCH_CHARS = re.compile(r"^[A-Za-z0-9._/-]+$")
_PATTERN_CHARS = re.compile(r"^[A-Za-z0-9._/*-]+$")


def _rule_message(model: type[object], needle: str) -> str:
    """The message of the model's CEL rule whose text contains `needle`."""
    extra = getattr(model, "model_config", {}).get("json_schema_extra") or {}
    for rule in extra.get("x-kubernetes-validations", []):
        if needle in rule["rule"]:
            return str(rule["message"])
    raise LookupError(f"{model.__name__} has no CEL rule containing {needle!r}")


def _field_rule_message(model: type[object], field_name: str) -> str:
    info = model.model_fields[field_name]  # type: ignore[attr-defined]
    extra = info.json_schema_extra or {}
    return str(extra["x-kubernetes-validations"][0]["message"])


def _branch_ok(branch: str) -> bool:
    return bool(
        _BRANCH_CHARS.match(branch)
        and not branch.startswith(("/", "-"))
        and not branch.endswith(("/", ".lock"))
        and ".." not in branch
        and "//" not in branch
    )


def _pattern_ok(pattern: str) -> bool:
    # The same rule as BRANCH_PATTERN_RULE's CEL.
    return bool(
        _PATTERN_CHARS.match(pattern)
        and not pattern.startswith(("/", "-", "refs/"))
        and not pattern.endswith(("/", ".lock"))
        and ".." not in pattern
        and "//" not in pattern
        and "***" not in pattern
        and pattern != "HEAD"
    )


def _patterns(path: str, patterns: list[str] | None) -> list[str]:
    return [
        _string(f"{path}[{i}]", BRANCH_PATTERN_MESSAGE)
        for i, p in enumerate(patterns or [])
        if not _pattern_ok(p)
    ]


def _root_ok(root: str) -> bool:
    # The same rule as Workspace.granted_root's CEL: /workspace or below, no '..', no '//'.
    under = root == "/workspace" or root.startswith("/workspace/")
    return under and "/../" not in root and not root.endswith("/..") and "//" not in root


def _object(path: str, message: str) -> str:
    return f'{path}: Invalid value: "object": {message}'


def _string(path: str, message: str) -> str:
    return f'{path}: Invalid value: "string": {message}'


def _agent(agent: Agent) -> list[str]:
    spec = agent.spec
    out: list[str] = []
    if any(p in spec.tools.deny for p in spec.tools.allow):
        out.append(_object("spec.tools", _rule_message(type(spec), "tools.deny")))
    if not spec.orchestrator and spec.limits.max_depth != 3:
        out.append(_object("spec.limits.maxDepth", _rule_message(type(spec), "maxDepth")))
    out += _patterns("spec.workspace.branches", spec.workspace.branches)
    out += _patterns("spec.landing.targets", spec.landing.targets)
    return out


def _session(session: Session) -> list[str]:
    # The API server reports the spec's own rules first, then nested ones by field path.
    spec = session.spec
    out: list[str] = []
    ws = spec.workspace
    if spec.read_only and ws.branch is not None:
        out.append(_object("spec.workspace.branch", _rule_message(SessionSpec, "readOnly")))
    if spec.landing is not None and spec.landing.targets is not None:
        out.append(_object("spec.landing.targets", LANDING_TARGETS_MESSAGE))
    if spec.evaluation is not None:
        criteria = spec.evaluation.criteria
        if (criteria.substring is None) == (criteria.command is None):
            out.append(
                _object(
                    "spec.evaluation.criteria",
                    _rule_message(EvaluationCriteria, "has(self.substring)"),
                )
            )
    if ws.branch is not None and not _branch_ok(ws.branch):
        out.append(_string("spec.workspace.branch", BRANCH_MESSAGE))
    if not _root_ok(ws.granted_root):
        out.append(
            _string("spec.workspace.grantedRoot", _field_rule_message(Workspace, "granted_root"))
        )
    return out


def cel_violations(resource: Resource) -> list[str]:
    if isinstance(resource, Agent):
        return _agent(resource)
    if isinstance(resource, Session):
        return _session(resource)
    return []
