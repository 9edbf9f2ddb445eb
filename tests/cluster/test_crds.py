"""The generated CRDs on a real kube-apiserver: valid objects in, invalid ones out, by field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral_dev.controlplane import REPO_ROOT, ControlPlane

SHA = "0123456789abcdef0123456789abcdef01234567"

AGENT: dict[str, Any] = {
    "apiVersion": "corral.dev/v1alpha1",
    "kind": "Agent",
    "metadata": {"name": "coder"},
    "spec": {
        "identity": "You are a careful engineer.",
        "model": "claude-sonnet-4-5",
        "tools": {"allow": ["read", "bash"], "deny": ["write"]},
        "limits": {"maxTurns": 10},
        "sandbox": {
            "egress": [
                {"host": "pypi.org"},
                {"host": "*.pythonhosted.org", "ports": [443]},
                {"host": "docs.example.com", "ports": [80], "methods": ["GET", "HEAD"]},
                {"cidr": "203.0.113.0/24", "ports": [5432]},
            ]
        },
    },
}
SESSION: dict[str, Any] = {
    "apiVersion": "corral.dev/v1alpha1",
    "kind": "Session",
    "metadata": {"name": "fix-bug"},
    "spec": {
        "agentRef": "coder",
        "task": "Make the tests pass.",
        "workspace": {"repo": "https://example.invalid/repo.git", "branch": "corral/fix-bug"},
        "evaluation": {"criteria": {"command": "pytest -q"}, "turnBudget": 3},
    },
}
GOAL: dict[str, Any] = {
    "apiVersion": "corral.dev/v1alpha1",
    "kind": "Goal",
    "metadata": {"name": "green"},
    "spec": {
        "description": "CI is green.",
        "success": {"name": "unit", "command": "pytest -q"},
        "sessionTemplate": {"spec": copy.deepcopy(SESSION["spec"])},
    },
}
EVIDENCE: dict[str, Any] = {
    "apiVersion": "corral.dev/v1alpha1",
    "kind": "Evidence",
    "metadata": {"name": "unit-0123456"},
    "spec": {
        "repo": "https://example.invalid/repo.git",
        "revision": SHA,
        "check": "unit",
        "command": "pytest -q",
    },
}
APPROVAL: dict[str, Any] = {
    "apiVersion": "corral.dev/v1alpha1",
    "kind": "Approval",
    "metadata": {"name": "land-1"},
    "spec": {
        "sessionRef": {"name": "fix-bug", "uid": "6b1f3c0e-0000-4000-8000-000000000001"},
        "action": {"tool": "land", "arguments": "{}", "digest": "sha256:" + "a" * 64},
        "reason": "landing needs a human",
    },
}

FREEZE: dict[str, Any] = {
    "apiVersion": "corral.dev/v1alpha1",
    "kind": "Freeze",
    "metadata": {"name": "session-fix-bug"},
    "spec": {"scope": {"session": "fix-bug"}, "reason": "incident 42"},
}


def _with(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `base` with the dotted `path` set to `value` (or removed when value is ...)."""
    obj = copy.deepcopy(base)
    *parents, leaf = path.split(".")
    node = obj
    for part in parents:
        node = node.setdefault(part, {})
    if value is ...:
        node.pop(leaf)
    else:
        node[leaf] = value
    return obj


# (id, object, words the API server's message must contain: the field path and the reason)
INVALID: list[tuple[str, dict[str, Any], list[str]]] = [
    ("agent-missing-identity", _with(AGENT, "spec.identity", ...), ["spec.identity", "Required"]),
    ("agent-missing-model", _with(AGENT, "spec.model", ...), ["spec.model", "Required"]),
    (
        "agent-thinking-enum",
        _with(AGENT, "spec.thinkingLevel", "extreme"),
        ["spec.thinkingLevel", "Unsupported value"],
    ),
    ("agent-loop-enum", _with(AGENT, "spec.loop", "forever"), ["spec.loop", "Unsupported value"]),
    (
        "agent-maxdepth-over-cap",
        _with(AGENT, "spec.limits", {"maxDepth": 7}),
        ["spec.limits.maxDepth", "less than or equal to 3"],
    ),
    (
        "agent-children-over-cap",
        _with(AGENT, "spec.limits", {"maxChildrenPerTurn": 6}),
        ["spec.limits.maxChildrenPerTurn", "less than or equal to 5"],
    ),
    (
        "agent-output-over-cap",
        _with(AGENT, "spec.limits", {"maxOutputTokens": 64000}),
        ["spec.limits.maxOutputTokens", "less than or equal to 32000"],
    ),
    (
        "agent-maxturns-type",
        _with(AGENT, "spec.limits", {"maxTurns": "ten"}),
        ["spec.limits.maxTurns", "integer"],
    ),
    (
        "agent-allow-and-deny",
        _with(AGENT, "spec.tools", {"allow": ["bash"], "deny": ["bash"]}),
        ["spec.tools", "both tools.allow and tools.deny"],
    ),
    (
        "agent-depth-needs-orchestrator",
        _with(AGENT, "spec.limits", {"maxDepth": 2}),
        ["spec.limits.maxDepth", "orchestrator"],
    ),
    (
        "agent-unknown-field",
        _with(AGENT, "spec.temperature", 2),
        ["spec.temperature", "unknown field"],
    ),
    (
        "agent-egress-port",
        _with(AGENT, "spec.sandbox", {"egress": [{"cidr": "10.0.0.0/8", "ports": [70000]}]}),
        ["spec.sandbox.egress[0].ports[0]", "less than or equal to 65535"],
    ),
    (
        "agent-egress-host-and-cidr",
        _with(AGENT, "spec.sandbox", {"egress": [{"host": "pypi.org", "cidr": "10.0.0.0/8"}]}),
        ["spec.sandbox.egress[0]", "exactly one of host and cidr must be set"],
    ),
    (
        "agent-egress-neither",
        _with(AGENT, "spec.sandbox", {"egress": [{"ports": [443]}]}),
        ["spec.sandbox.egress[0]", "exactly one of host and cidr must be set"],
    ),
    (
        "agent-egress-methods-on-cidr",
        _with(AGENT, "spec.sandbox", {"egress": [{"cidr": "10.0.0.0/8", "methods": ["GET"]}]}),
        ["spec.sandbox.egress[0]", "methods needs host"],
    ),
    (
        "agent-egress-bad-host",
        _with(AGENT, "spec.sandbox", {"egress": [{"host": "pypi.org/simple"}]}),
        ["spec.sandbox.egress[0].host", "should match"],
    ),
    (
        "agent-egress-bad-method",
        _with(AGENT, "spec.sandbox", {"egress": [{"host": "pypi.org", "methods": ["TRACE"]}]}),
        ["spec.sandbox.egress[0].methods[0]", "Unsupported value"],
    ),
    ("session-missing-task", _with(SESSION, "spec.task", ...), ["spec.task", "Required"]),
    (
        "session-missing-workspace",
        _with(SESSION, "spec.workspace", ...),
        ["spec.workspace", "Required"],
    ),
    (
        "session-bad-branch",
        _with(SESSION, "spec.workspace.branch", "feature/../main"),
        ["spec.workspace.branch", "valid git branch name"],
    ),
    (
        "session-branch-lock",
        _with(SESSION, "spec.workspace.branch", "topic.lock"),
        ["spec.workspace.branch", "valid git branch name"],
    ),
    (
        "session-relative-root",
        _with(SESSION, "spec.workspace.grantedRoot", "work/../etc"),
        ["spec.workspace.grantedRoot", "/workspace or a path below it"],
    ),
    (
        "session-root-escapes-workspace",
        _with(SESSION, "spec.workspace.grantedRoot", "/workspace/../opt"),
        ["spec.workspace.grantedRoot", "/workspace or a path below it"],
    ),
    (
        "session-two-criteria",
        _with(SESSION, "spec.evaluation.criteria", {"substring": "done", "command": "true"}),
        ["spec.evaluation.criteria", "exactly one of substring or command"],
    ),
    (
        "session-no-criteria",
        _with(SESSION, "spec.evaluation", {"turnBudget": 2}),
        ["spec.evaluation.criteria", "Required"],
    ),
    (
        "session-readonly-branch",
        _with(SESSION, "spec.readOnly", True),
        ["spec.workspace.branch", "read-only session cannot have a branch"],
    ),
    (
        "session-bad-agentref",
        _with(SESSION, "spec.agentRef", "Not_A_Name"),
        ["spec.agentRef", "should match"],
    ),
    (
        "session-ttl-negative",
        _with(SESSION, "spec.ttlSecondsAfterFinished", -1),
        ["spec.ttlSecondsAfterFinished", "greater than or equal to 0"],
    ),
    (
        "session-override-thinking",
        _with(SESSION, "spec.overrides", {"thinkingLevel": "max"}),
        ["spec.overrides.thinkingLevel", "Unsupported value"],
    ),
    (
        "goal-maxwaves-zero",
        _with(GOAL, "spec.maxWaves", 0),
        ["spec.maxWaves", "greater than or equal to 1"],
    ),
    (
        "goal-check-name-not-a-label",  # it names the Evidence check, a label value
        _with(GOAL, "spec.success.name", "Unit Tests"),
        ["spec.success.name", "should match"],
    ),
    (
        "session-wake-zero",
        _with(SESSION, "spec.wake", {"afterSeconds": 0}),
        ["spec.wake.afterSeconds", "greater than or equal to 1"],
    ),
    (
        "evidence-short-revision",
        _with(EVIDENCE, "spec.revision", "abc123"),
        ["spec.revision", "40-character"],
    ),
    (
        "evidence-uppercase-revision",
        _with(EVIDENCE, "spec.revision", SHA.upper()),
        ["spec.revision", "40-character"],
    ),
    (
        "evidence-missing-command",
        _with(EVIDENCE, "spec.command", ...),
        ["spec.command", "Required"],
    ),
    (
        "approval-bad-digest",
        _with(APPROVAL, "spec.action.digest", "md5:abc"),
        ["spec.action.digest", "sha256"],
    ),
    (
        "approval-no-uid",
        _with(APPROVAL, "spec.sessionRef", {"name": "fix-bug"}),
        ["spec.sessionRef.uid", "uid is required"],
    ),
    (
        "freeze-two-scopes",
        _with(FREEZE, "spec.scope", {"session": "fix-bug", "agent": "coder"}),
        ["spec.scope", "exactly one scope"],
    ),
    (
        "freeze-no-scope",
        _with(FREEZE, "spec.scope", {"namespace": False}),
        ["spec.scope", "exactly one scope"],
    ),
    (
        "freeze-bad-agent-name",
        _with(FREEZE, "spec.scope", {"agent": "Not_A_Name"}),
        ["spec.scope.agent", "should match"],
    ),
]


def _create(plane: ControlPlane, namespace: str, obj: dict[str, Any]) -> tuple[int, str]:
    done = plane.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(obj), check=False)
    return done.returncode, done.stdout + done.stderr


def test_valid_objects_are_accepted(control_plane: ControlPlane, namespace: str) -> None:
    for obj in (AGENT, SESSION, GOAL, EVIDENCE, APPROVAL, FREEZE):
        code, out = _create(control_plane, namespace, obj)
        assert code == 0, out
    freeze = json.loads(
        control_plane.kubectl(
            "get", "freeze", "session-fix-bug", "-n", namespace, "-o", "json"
        ).stdout
    )
    assert freeze["spec"]["frozen"] is True  # in force unless it says otherwise
    moved = control_plane.kubectl(
        "patch", "freeze", "session-fix-bug", "-n", namespace, "--type=merge",
        "-p", '{"spec": {"scope": {"session": "other"}}}', check=False,
    )  # fmt: skip
    assert moved.returncode != 0 and "scope is immutable" in moved.stderr, moved.stderr
    # Defaults come from the schema, applied by the API server itself.
    agent = json.loads(
        control_plane.kubectl("get", "agent", "coder", "-n", namespace, "-o", "json").stdout
    )
    assert agent["spec"]["thinkingLevel"] == "medium"
    assert agent["spec"]["limits"]["maxDepth"] == 3
    assert agent["spec"]["loop"] == "auto"


@pytest.mark.parametrize(("case", "obj", "words"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_object_is_rejected_naming_the_field(
    control_plane: ControlPlane, namespace: str, case: str, obj: dict[str, Any], words: list[str]
) -> None:
    code, out = _create(control_plane, namespace, obj)
    assert code != 0, f"{case} was accepted"
    for word in words:
        assert word in out, f"{case}: {word!r} not in API server message:\n{out}"


def test_kubectl_apply_of_a_granted_root_outside_the_workspace_is_rejected(
    control_plane: ControlPlane, namespace: str
) -> None:
    """The image's own files (where corral-exec lives) are never a granted root."""
    session = _with(SESSION, "spec.workspace.grantedRoot", "/opt/corral/bin")
    done = control_plane.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(session), check=False
    )
    assert done.returncode != 0
    assert "spec.workspace.grantedRoot" in done.stderr, done.stderr
    assert "/workspace or a path below it" in done.stderr
    gone = control_plane.kubectl("get", "session", "fix-bug", "-n", namespace, check=False)
    assert gone.returncode != 0


def test_invalid_catalog_is_large_enough() -> None:
    assert len(INVALID) >= 15
    assert {o["kind"] for _, o, _ in INVALID} == {
        "Agent",
        "Session",
        "Goal",
        "Evidence",
        "Approval",
        "Freeze",
    }


def test_every_example_is_accepted(control_plane: ControlPlane, namespace: str) -> None:
    examples = REPO_ROOT / "examples"
    files = sorted([*examples.glob("*.yaml"), *examples.glob("admin/*.yaml")])
    kinds = set()
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                kinds.add(doc["kind"])
        done = control_plane.kubectl("apply", "-n", namespace, "-f", str(path), check=False)
        assert done.returncode == 0, f"{path.name}: {done.stderr}"
    assert {"Agent", "Session"} <= kinds


def test_kubectl_get_corral_shows_printer_columns(
    control_plane: ControlPlane, namespace: str
) -> None:
    for obj in (AGENT, SESSION, EVIDENCE, APPROVAL, FREEZE):
        _create(control_plane, namespace, obj)
    out = control_plane.kubectl("get", "corral", "-n", namespace).stdout
    lines = [line.split() for line in out.splitlines()]
    headers = [line for line in lines if line and line[0] == "NAME"]
    columns = ["NAME", "AGENT", "PHASE", "TURNS", "RESTARTS", "OUTCOME", "FROZEN", "WAKES", "AGE"]
    assert columns in headers, out
    assert ["NAME", "SESSION", "AGENT", "NAMESPACE", "FROZEN", "AGE"] in headers, out
    assert ["NAME", "REVISION", "CHECK", "VERDICT", "AGE"] in headers, out
    assert ["NAME", "SESSION", "ACTION", "DECISION", "AGE"] in headers, out
    assert ["NAME", "MODEL", "LOOP", "ORCHESTRATOR", "READY", "AGE"] in headers, out
    assert any(SHA in line for line in lines), out
    # Short names resolve.
    assert "fix-bug" in control_plane.kubectl("get", "sess", "-n", namespace).stdout
    assert "session-fix-bug" in control_plane.kubectl("get", "frz", "-n", namespace).stdout


def test_kubectl_explain_shows_descriptions(control_plane: ControlPlane) -> None:
    out = control_plane.kubectl("explain", "session.spec").stdout
    assert "agentRef" in out and "Agent in this namespace." in out
    assert "evaluation" in out and "Evaluation guard." in out
    out = control_plane.kubectl("explain", "agent.spec.limits.maxDepth").stdout
    assert "Depth of the child tree." in out


def test_status_is_a_subresource(control_plane: ControlPlane, namespace: str) -> None:
    _create(control_plane, namespace, SESSION)
    # A write to the main resource cannot set status...
    patched = _with(SESSION, "status", {"phase": "Succeeded"})
    control_plane.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(patched),
    )
    got = json.loads(
        control_plane.kubectl("get", "session", "fix-bug", "-n", namespace, "-o", "json").stdout
    )
    assert got.get("status", {}).get("phase") != "Succeeded"
    # ...only the status subresource can, and its schema is enforced too.
    bad = control_plane.kubectl(
        "patch",
        "session",
        "fix-bug",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Exploded"}}),
        check=False,
    )
    assert bad.returncode != 0 and "status.phase" in bad.stderr


def test_approval_decision_is_final(control_plane: ControlPlane, namespace: str) -> None:
    _create(control_plane, namespace, APPROVAL)

    def decide(decision: str) -> Any:
        return control_plane.kubectl(
            "patch",
            "approval",
            "land-1",
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"decision": decision}}),
            check=False,
        )

    assert decide("Approved").returncode == 0
    flipped = decide("Denied")
    assert flipped.returncode != 0 and "a decision is final" in flipped.stderr


def test_evidence_spec_is_immutable(control_plane: ControlPlane, namespace: str) -> None:
    _create(control_plane, namespace, EVIDENCE)
    done = control_plane.kubectl(
        "patch",
        "evidence",
        "unit-0123456",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"revision": "f" * 40}}),
        check=False,
    )
    assert done.returncode != 0 and "immutable" in done.stderr


def test_installed_crds_match_the_generated_files(control_plane: ControlPlane) -> None:
    for path in sorted((REPO_ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        live = json.loads(
            control_plane.kubectl("get", "crd", crd["metadata"]["name"], "-o", "json").stdout
        )
        version = live["spec"]["versions"][0]
        assert version["subresources"] == {"status": {}}
        assert "corral" in live["spec"]["names"]["categories"]
        assert Path(path).name.endswith(f"{live['spec']['names']['plural']}.yaml")
