"""Structured output's pure parts: the schema check, the answer check, the Session field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from corral_api.crdgen import schema_of
from corral_api.kinds import Session
from corral_api.output_schema import output_errors, schema_problem
from corral_harness.policy.structured import answer_json, check_output

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["ok"],
    "properties": {"ok": {"type": "boolean"}, "notes": {"type": "array", "maxItems": 1}},
}


def _session(schema: Any) -> Session:
    return Session.model_validate(
        {
            "metadata": {"name": "s"},
            "spec": {
                "agentRef": "a",
                "task": "t",
                "workspace": {"repo": "r"},
                "outputSchema": schema,
            },
        }
    )


def test_a_schema_is_checked_against_its_meta_schema_and_its_size() -> None:
    assert schema_problem(SCHEMA) is None
    assert schema_problem({"$schema": "http://json-schema.org/draft-07/schema#"}) is None
    assert "not list" in (schema_problem([]) or "")
    assert "at type" in (schema_problem({"type": 5}) or "")
    assert "at most 32768" in (schema_problem({"title": "x" * 33_000}) or "")


def test_the_answer_may_sit_in_one_code_fence_but_nothing_else_around_it() -> None:
    assert answer_json('  {"ok": true} ') == {"ok": True}
    assert answer_json('```json\n{"ok": true}\n```') == {"ok": True}
    assert answer_json('```\n{"ok": false}```') == {"ok": False}
    with pytest.raises(ValueError, match="not valid JSON"):
        answer_json('Here it is: {"ok": true}')
    with pytest.raises(ValueError, match="empty"):
        answer_json("``` \n```")


def test_errors_name_the_json_path_and_are_capped() -> None:
    value, errors = check_output('{"ok": "yes", "notes": [1, 2]}', SCHEMA)
    assert value == {"ok": "yes", "notes": [1, 2]}
    assert errors == ["$.notes: [1, 2] is too long", "$.ok: 'yes' is not of type 'boolean'"]
    many = {"type": "array", "items": {"type": "string"}}
    found = output_errors(list(range(9)), many)
    assert len(found) == 6 and found[-1] == "... and 4 more"


def test_the_session_field_refuses_a_bad_schema_and_the_crd_keeps_the_body() -> None:
    assert _session(SCHEMA).spec.output_schema == SCHEMA
    with pytest.raises(ValidationError, match="outputSchema is not a valid JSON Schema"):
        _session({"required": "ok"})
    crd = schema_of(Session)["properties"]
    field = crd["spec"]["properties"]["outputSchema"]
    assert field["type"] == "object" and field["x-kubernetes-preserve-unknown-fields"] is True
    assert crd["status"]["properties"]["output"]["x-kubernetes-preserve-unknown-fields"] is True


def test_the_example_session_is_valid_and_its_schema_accepts_a_review() -> None:
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[3]
    doc = yaml.safe_load((root / "examples" / "session-structured-output.yaml").read_text())
    schema = Session.model_validate(doc).spec.output_schema
    assert schema is not None
    review = {"verdict": "approve", "score": 8, "findings": [{"file": "a.py", "note": "ok"}]}
    assert output_errors(review, schema) == []
