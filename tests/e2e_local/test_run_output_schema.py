"""`corral run --output-schema FILE`: the real harness, custodian, scripted model and driver;
the validated object is printed last and recorded in state.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import corral_run, write_session

pytestmark = pytest.mark.timeout(120)

SCHEMA = {
    "type": "object",
    "required": ["fixed", "files"],
    "properties": {"fixed": {"type": "boolean"}, "files": {"type": "array"}},
}


def test_the_validated_object_is_printed_and_saved(demo_workspace: Path, tmp_path: Path) -> None:
    answer = {"fixed": True, "files": ["shop/pricing.py"]}
    session, scenario = write_session(
        tmp_path,
        evaluation=None,
        scenario_replies=[{"text": "Fixed it."}, {"text": json.dumps(answer)}],
    )
    schema = tmp_path / "schema.yaml"
    schema.write_text(json.dumps(SCHEMA))
    done = corral_run(
        "-f", str(session), "--workspace", str(demo_workspace), "--scenario", str(scenario),
        "--output-schema", str(schema), state_dir=tmp_path / "state",
    )  # fmt: skip
    assert done.code == 0, done.stderr + done.stdout
    printed = done.stdout[done.stdout.rindex("{\n") :]
    assert json.loads(printed) == answer
    assert json.loads((done.state_dir / "state.json").read_text())["output"] == answer


def test_a_bad_schema_file_is_invalid_input(tmp_path: Path) -> None:
    session, _ = write_session(tmp_path, evaluation=None, scenario_replies=[])
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "objekt"}))
    done = corral_run("-f", str(session), "--output-schema", str(schema), state_dir=tmp_path / "s")
    assert done.code == 2
    assert "--output-schema" in done.stderr and "not a valid JSON Schema at type" in done.stderr
