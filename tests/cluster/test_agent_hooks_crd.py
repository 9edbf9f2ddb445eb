"""Agent.spec.hooks on the real kube-apiserver: a good hook spec in, bad ones out with a
message naming what is wrong."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from corral_dev.controlplane import REPO_ROOT, ControlPlane

AGENT: dict[str, Any] = {
    "apiVersion": "corral.dev/v1alpha1",
    "kind": "Agent",
    "metadata": {"name": "hooked"},
    "spec": {"identity": "You are careful.", "model": "claude-sonnet-4-5"},
}


def _agent(hooks: dict[str, Any], **spec: Any) -> dict[str, Any]:
    agent = copy.deepcopy(AGENT)
    agent["spec"].update(hooks=hooks, **spec)
    return agent


def _create(plane: ControlPlane, namespace: str, obj: dict[str, Any]) -> tuple[int, str]:
    done = plane.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(obj), check=False)
    return done.returncode, done.stdout + done.stderr


def test_the_example_agent_with_hooks_is_accepted_with_its_defaults(
    control_plane: ControlPlane, namespace: str
) -> None:
    path = REPO_ROOT / "examples" / "agent-hooks.yaml"
    done = control_plane.kubectl("apply", "-n", namespace, "-f", str(path), check=False)
    assert done.returncode == 0, done.stderr
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    stored = json.loads(
        control_plane.kubectl("get", "agent", name, "-n", namespace, "-o", "json").stdout
    )
    hooks = stored["spec"]["hooks"]
    assert hooks["timeoutSeconds"] == 30
    (guard,) = hooks["beforeTool"]
    assert guard["matcher"] == ["bash"]
    assert (guard["runIn"], guard["onError"]) == ("harness", "deny")
    assert hooks["afterTool"][0]["runIn"] == "tools"
    assert stored["spec"]["credentials"]["hookSecretRef"]["name"] == "policy-server"


BAD: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "both-handlers",
        {"beforeTool": [{"name": "a", "command": "true", "http": {"url": "https://p.example/h"}}]},
        ["spec.hooks.beforeTool[0]", "exactly one handler: command or http"],
    ),
    (
        "no-handler",
        {"afterTurn": [{"name": "a"}]},
        ["spec.hooks.afterTurn[0]", "exactly one handler"],
    ),
    (
        "matcher-outside-tool-phases",
        {"afterTurn": [{"name": "a", "matcher": ["bash"], "command": "true"}]},
        ["spec.hooks.afterTurn", "matcher applies to beforeTool and afterTool hooks only"],
    ),
    (
        "http-run-in-tools",
        {"beforeTool": [{"name": "a", "http": {"url": "https://p.example/h"}, "runIn": "tools"}]},
        ["spec.hooks.beforeTool[0].runIn", "runIn applies to command hooks only"],
    ),
    (
        "duplicate-names",
        {"afterTool": [{"name": "a", "command": "true"}, {"name": "a", "command": "false"}]},
        ["spec.hooks.afterTool[1]", "Duplicate value"],
    ),
    (
        "bad-url",
        {"beforeTool": [{"name": "a", "http": {"url": "file:///etc/passwd"}}]},
        ["spec.hooks.beforeTool[0].http.url", "should match"],
    ),
    (
        "header-without-value",
        {
            "beforeTool": [
                {"name": "a", "http": {"url": "https://p.example/h", "headers": [{"name": "X"}]}}
            ]
        },
        ["spec.hooks.beforeTool[0].http.headers[0]", "exactly one of value or secretKey"],
    ),
    (
        "timeout-too-long",
        {"beforeTool": [{"name": "a", "command": "true", "timeoutSeconds": 3600}]},
        ["spec.hooks.beforeTool[0].timeoutSeconds", "600"],
    ),
    (
        "bad-on-error",
        {"beforeTool": [{"name": "a", "command": "true", "onError": "ignore"}]},
        ["spec.hooks.beforeTool[0].onError", "Unsupported value"],
    ),
]


@pytest.mark.parametrize(("case", "hooks", "words"), BAD, ids=[c[0] for c in BAD])
def test_a_bad_hook_spec_is_rejected_naming_the_field(
    control_plane: ControlPlane, namespace: str, case: str, hooks: dict[str, Any], words: list[str]
) -> None:
    code, out = _create(control_plane, namespace, _agent(hooks))
    assert code != 0, f"{case} was accepted"
    for word in words:
        assert word in out, f"{case}: {word!r} not in the API server's message:\n{out}"


def test_kubectl_explain_describes_the_hook_fields(control_plane: ControlPlane) -> None:
    out = control_plane.kubectl("explain", "agent.spec.hooks.beforeTool").stdout
    assert "matcher" in out and "onError" in out and "runIn" in out
    out = control_plane.kubectl("explain", "agent.spec.hooks.beforeTool.runIn").stdout
    assert "advisory" in out
