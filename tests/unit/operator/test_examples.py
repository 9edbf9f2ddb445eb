"""The example manifests the operator's docs point at are valid against the API models."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from corral_api import KIND_BY_NAME

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize(
    "name",
    [
        "goal.yaml",
        "session-wake.yaml",
        "evidence.yaml",
        "approval.yaml",
        "admin/freeze-namespace.yaml",
        "admin/freeze-agent.yaml",
        "admin/freeze-session.yaml",
    ],
)
def test_example_is_a_valid_resource(name: str) -> None:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    model = KIND_BY_NAME[doc["kind"]]
    parsed = model.model_validate(doc)
    assert parsed.wire()["metadata"]["name"]
    # What the operator would read back from the API server parses to the same object.
    assert model.model_validate(parsed.wire()) == parsed
