"""Structured output: the final answer must be JSON valid for a schema, or the turn is not done.

The schema comes with the admission (`outputSchema`, from `Session.spec.outputSchema`) and is
checked with `jsonschema` (full JSON Schema; Draft 2020-12 unless the schema names its
`$schema`) through `corral_api.output_schema`, the same checker the Session model uses. The turn
asks `check_output` after each run; an invalid answer goes back to the model with the errors.

What counts as the answer: the run's final assistant text, as JSON. One surrounding Markdown code
fence (```json ... ```) is tolerated, since models often add one; any other prose is not.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from corral_api.output_schema import output_errors, schema_problem

_FENCED: Final = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\n(?P<body>.*?)\n?```\Z", re.DOTALL)


class UnsupportedSchema(ValueError):
    """The schema is not a JSON Schema the checker can use."""


def check_schema(schema: Any) -> None:
    """Refuse a schema that is not a valid JSON Schema object (or too large)."""
    problem = schema_problem(schema)
    if problem is not None:
        raise UnsupportedSchema(f"the output schema {problem}")


def answer_json(text: str) -> Any:
    """The final answer as a JSON value; `ValueError` says why it is not one."""
    body = text.strip()
    fenced = _FENCED.match(body)
    if fenced is not None:
        body = fenced.group("body").strip()
    if not body:
        raise ValueError("the answer is empty; it must be a JSON value")
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"the answer is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc


def check_output(text: str, schema: dict[str, Any]) -> tuple[Any, list[str]]:
    """(the parsed answer, why it does not satisfy `schema`); the errors are empty when it does."""
    try:
        value = answer_json(text)
    except ValueError as exc:
        return None, [str(exc)]
    return value, output_errors(value, schema)


def structured_output_errors(text: str, schema: dict[str, Any]) -> list[str]:
    """Why `text` is not valid structured output; empty when it is."""
    return check_output(text, schema)[1]


def schema_instruction(schema: dict[str, Any]) -> str:
    """The system-prompt lines that tell the model what its final answer must be."""
    return (
        "When you have finished, your final answer must be only a JSON value that satisfies "
        "this JSON Schema, with no other text around it:\n"
        + json.dumps(schema, indent=1, sort_keys=True)
    )


def send_back_reason(errors: list[str]) -> str:
    """What the model reads when its answer goes back: the validation errors."""
    return "your final answer is not valid structured output: " + "; ".join(errors)
