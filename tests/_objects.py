"""Corral's objects as the API server hands them to the operator, built for tests: one small
world (Agent `coder`, Session `fix-bug` in namespace `team-a`, and its sandbox pod), with
keyword arguments for what a test varies. Typed models (`agent`, `session`) for what takes
models, their wire bodies with a status (`agent_body`, `session_body`) for the planners."""

from __future__ import annotations

from typing import Any

from corral_api.digest import action_digest, canonical_json
from corral_api.kinds import Agent, Session

NAMESPACE = "team-a"
SESSION_UID = "0d9c7d5e-1111-2222-3333-444455556666"
REPO = "https://git.example/repo.git"


def agent(name: str = "coder", **spec: Any) -> Agent:
    body: dict[str, Any] = {"identity": "You write code.", "model": "claude-test"}
    body.update(spec)
    return Agent.model_validate(
        {"metadata": {"name": name, "namespace": NAMESPACE, "uid": "agent-uid"}, "spec": body}
    )


def agent_body(name: str = "coder", *, ready: bool = True, **spec: Any) -> dict[str, Any]:
    """The Agent as the operator reads it: at generation 1, Ready (or not: an invalid spec)."""
    body: dict[str, Any] = agent(name, **spec).wire()
    body["metadata"]["generation"] = 1
    body["status"] = {
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "Validated" if ready else "InvalidSpec",
                "message": "ok" if ready else "tools.deny has '*'",
                "lastTransitionTime": "2026-11-29T11:00:00Z",
                "observedGeneration": 1,
            }
        ]
    }
    return body


def session(name: str = "fix-bug", agent_ref: str = "coder", **spec: Any) -> Session:
    body: dict[str, Any] = {
        "agentRef": agent_ref,
        "task": "Fix the bug.",
        "workspace": {"repo": REPO, "ref": "main"},
    }
    body.update(spec)
    return Session.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "uid": SESSION_UID,
                "generation": 1,
            },
            "spec": body,
        }
    )


def session_body(
    name: str = "fix-bug",
    uid: str | None = None,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """The Session as the operator reads it, with `status` (none: a new Session)."""
    body: dict[str, Any] = session(name, **spec).wire()
    if uid is not None:
        body["metadata"]["uid"] = uid
    if annotations:
        body["metadata"]["annotations"] = annotations
    body["status"] = status or {}
    return body


def sandbox_pod(
    ready: bool, ip: str = "127.0.3.4", deleting: bool = False, owner: str = SESSION_UID
) -> dict[str, Any]:
    """The Session's sandbox pod, controlled by the Session of uid `owner`."""
    md: dict[str, Any] = {
        "name": "corral-fix-bug",
        "uid": "pod-uid",
        "ownerReferences": [
            {
                "apiVersion": "corral.dev/v1alpha1",
                "kind": "Session",
                "name": "fix-bug",
                "uid": owner,
                "controller": True,
            }
        ],
    }
    if deleting:
        md["deletionTimestamp"] = "2026-11-29T11:59:00Z"
    return {
        "metadata": md,
        "status": {
            "podIP": ip if ready else None,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def approval(
    name: str,
    session: str = "fix-bug",
    uid: str = SESSION_UID,
    *,
    tool: str = "land",
    arguments: Any = None,
    revision: str | None = None,
    digest: str | None = None,
    namespace: str | None = None,
    reason: str | None = None,
    decision: str | None = None,
) -> dict[str, Any]:
    """An Approval of a Session's `tool` call as the custodian writes one: the arguments in
    canonical JSON and their digest (unless `digest` forges one). A land call's arguments are
    `revision` on main unless `arguments` says otherwise."""
    args = {"revision": revision, "target": "main"} if arguments is None else arguments
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    spec: dict[str, Any] = {
        "sessionRef": {"name": session, "uid": uid},
        "action": {
            "tool": tool,
            "arguments": canonical_json(args),
            "digest": digest or action_digest(tool, args),
        },
    }
    if reason is not None:
        spec["reason"] = reason
    body: dict[str, Any] = {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Approval",
        "metadata": metadata,
        "spec": spec,
    }
    if decision is not None:
        body["status"] = {"decision": decision}
    return body


def approval_decision(decision: str | None, uid: str = SESSION_UID) -> dict[str, Any]:
    """What the Session planner reads of an Approval: the Session it is for, and its decision
    (none: pending)."""
    body: dict[str, Any] = {"spec": {"sessionRef": {"name": "fix-bug", "uid": uid}}}
    if decision:
        body["status"] = {"decision": decision}
    return body


def evidence(
    name: str,
    *,
    repo: str,
    revision: str,
    command: str,
    check: str = "unit",
    namespace: str | None = None,
    labels: dict[str, str] | None = None,
    digest: str | None = None,
) -> dict[str, Any]:
    """An Evidence: the check `command` at `revision` of `repo` (`digest`: its definition's)."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if labels is not None:
        metadata["labels"] = labels
    spec: dict[str, Any] = {"repo": repo, "revision": revision, "check": check, "command": command}
    if digest is not None:
        spec["definitionDigest"] = digest
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Evidence",
        "metadata": metadata,
        "spec": spec,
    }
