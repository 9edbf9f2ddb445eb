"""Structured output: the JSON Schema a final answer must satisfy (docs/structured-output.md).

One checker for every side: the Session model refuses a bad `spec.outputSchema` (so the operator
marks the Session `InvalidSpec` and `corral run` refuses the file), the harness refuses it at
admission (400), and the harness validates each final answer against it. `jsonschema` is slow
to import (ADR 0070), so it is imported on the first schema, never on a start path.
"""

from __future__ import annotations

import json
from typing import Any

# The schema travels in the Session, in every admission and in the system prompt: keep it small.
MAX_OUTPUT_SCHEMA_BYTES = 32 * 1024
# The validated answer lands in Session.status.output (an etcd object is at most ~1.5 MiB).
MAX_OUTPUT_BYTES = 64 * 1024
# Validation errors sent back to the model (and into the failure message) per attempt.
MAX_REPORTED_ERRORS = 5


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")).encode())


def schema_problem(schema: Any) -> str | None:
    """Why `schema` cannot be an output schema, or None. Checked against the JSON Schema
    meta-schema of its own `$schema` (Draft 2020-12 when it names none)."""
    if not isinstance(schema, dict):
        return f"must be a JSON Schema object, not {type(schema).__name__}"
    size = _size(schema)
    if size > MAX_OUTPUT_SCHEMA_BYTES:
        return f"is {size} bytes as JSON; at most {MAX_OUTPUT_SCHEMA_BYTES} are allowed"
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema, default=validators.Draft202012Validator).check_schema(
            schema
        )
    except exceptions.SchemaError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "(root)"
        return f"is not a valid JSON Schema at {where}: {err.message}"
    return None


def output_errors(value: Any, schema: dict[str, Any]) -> list[str]:
    """Why `value` does not satisfy `schema` (a checked schema), at most a few, each naming the
    JSON path; empty when it does."""
    from jsonschema import validators

    validator = validators.validator_for(schema, default=validators.Draft202012Validator)(schema)
    found = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    errors = [f"{err.json_path}: {err.message}" for err in found[:MAX_REPORTED_ERRORS]]
    if len(found) > MAX_REPORTED_ERRORS:
        errors.append(f"... and {len(found) - MAX_REPORTED_ERRORS} more")
    if not errors and _size(value) > MAX_OUTPUT_BYTES:
        errors.append(f"$: the answer is larger than {MAX_OUTPUT_BYTES} bytes as JSON")
    return errors
