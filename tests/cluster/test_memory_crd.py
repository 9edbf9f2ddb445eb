"""`Agent.spec.memory` on a real kube-apiserver: the example is accepted with its defaults,
a bad scope is refused naming the field, and `kubectl explain` describes every field."""

from __future__ import annotations

import json

import yaml

from corral_dev.controlplane import REPO_ROOT, ControlPlane

EXAMPLE = REPO_ROOT / "examples" / "agent-memory.yaml"


def test_the_memory_example_is_accepted_with_defaults(
    control_plane: ControlPlane, namespace: str
) -> None:
    control_plane.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    doc = yaml.safe_load(EXAMPLE.read_text())
    name = doc["metadata"]["name"]
    stored = json.loads(
        control_plane.kubectl("get", "agent", name, "-n", namespace, "-o", "json").stdout
    )
    assert stored["spec"]["memory"] == {
        "enabled": True,  # the API server's default: the block is there, memory is on
        "scope": "reviewers",
        "extractAfterTurn": True,
    }


def test_a_scope_with_a_control_character_is_refused(
    control_plane: ControlPlane, namespace: str
) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["memory"]["scope"] = "team\nother"
    done = control_plane.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=False
    )
    assert done.returncode != 0 and "spec.memory.scope" in done.stderr, done.stderr


def test_kubectl_explain_describes_memory(control_plane: ControlPlane) -> None:
    out = control_plane.kubectl("explain", "agent.spec.memory").stdout
    for field in ("enabled", "scope", "extractAfterTurn"):
        assert field in out, out
    assert "namespace" in control_plane.kubectl("explain", "agent.spec.memory.scope").stdout
