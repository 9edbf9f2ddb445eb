"""`corral run` refuses bad YAML with the words the real kube-apiserver uses for the same YAML.

Each document is applied to a real API server (the project's local control plane, CRDs from
crds/) and validated locally; the two refusals must match line for line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral_cli._manifests import ManifestError, validate_resource

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]

AGENT: dict[str, Any] = {"identity": "x", "model": "m"}
SESSION: dict[str, Any] = {"agentRef": "a", "task": "t", "workspace": {"repo": "r"}}


def doc(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


CASES = {
    "above a cap": doc("Agent", "a1", {**AGENT, "orchestrator": True, "limits": {"maxDepth": 7}}),
    "below a minimum": doc("Agent", "a2", {**AGENT, "limits": {"maxTurns": 0}}),
    "empty string": doc("Session", "s1", {**SESSION, "task": ""}),
    "too long": doc("Agent", "a3", {**AGENT, "model": "m" * 129}),
    "not in the enum": doc("Session", "s2", {**SESSION, "overrides": {"thinkingLevel": "extreme"}}),
    "wrong type": doc("Session", "s3", {**SESSION, "ttlSecondsAfterFinished": "3"}),
    "wrong item type": doc("Agent", "a4", {**AGENT, "tools": {"allow": ["bash", 3]}}),
    "pattern": doc("Session", "s4", {**SESSION, "agentRef": "Not_A_Name"}),
    "missing": doc("Session", "s5", {"agentRef": "a", "workspace": {"repo": "r"}}),
    "unknown fields": doc("Session", "s6", {**SESSION, "surprise": 1, "other": 2}),
    "cel rules": doc(
        "Session",
        "s7",
        {
            **SESSION,
            "readOnly": True,
            "workspace": {"repo": "r", "branch": "corral/x", "grantedRoot": "/w/../etc"},
            "evaluation": {"criteria": {"substring": "a", "command": "b"}},
        },
    ),
    "branch rule": doc(
        "Session", "s8", {**SESSION, "workspace": {"repo": "r", "branch": "../evil"}}
    ),
    "agent rules": doc(
        "Agent",
        "a5",
        {**AGENT, "tools": {"allow": ["bash"], "deny": ["bash"]}, "limits": {"maxDepth": 2}},
    ),
}

_SKIPPED_RULES = re.compile(
    r"^\* <nil>: Invalid value: null: some validation rules were not.*$\n?", re.M
)


def normalise(text: str) -> list[str]:
    """The refusal's lines, without kubectl's prefix and the note on rules not yet checked."""
    text = re.sub(
        r"^Error from server \(BadRequest\): error when creating \"[^\"]+\": ", "", text.strip()
    )
    text = _SKIPPED_RULES.sub("", text)
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    if len(lines) == 2 and lines[1].startswith("* "):  # one error left: the one-line form
        lines = [f"{lines[0]} {lines[1][2:]}"]
    return sorted(lines)


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from corral_dev import controlplane

    plane = controlplane.start(tmp_path_factory.mktemp("cp"), controller_manager=False)
    try:
        plane.kubectl("apply", "-f", str(ROOT / "crds"))
        plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        plane.kubectl("create", "namespace", "parity")
        yield plane
    finally:
        plane.stop()


@pytest.mark.parametrize("case", sorted(CASES))
def test_local_refusal_matches_the_api_server(apiserver: Any, case: str, tmp_path: Path) -> None:
    manifest = CASES[case]
    path = tmp_path / "doc.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    server = apiserver.kubectl("apply", "-n", "parity", "-f", str(path), check=False)
    assert server.returncode != 0, f"the API server accepted {case}"
    with pytest.raises(ManifestError) as local:
        validate_resource(manifest, str(path))
    assert normalise(str(local.value)) == normalise(server.stderr)


def test_the_examples_are_accepted_by_both(apiserver: Any) -> None:
    for name in ("agent.yaml", "session.yaml"):
        path = ROOT / "examples" / name
        for manifest in yaml.safe_load_all(path.read_text()):
            validate_resource(manifest, name)
        result = apiserver.kubectl(
            "apply", "-n", "parity", "--dry-run=server", "-f", str(path), check=False
        )
        assert result.returncode == 0, result.stderr
