"""Structured output: the final text must be JSON valid against a schema, or the turn is not done.

A small JSON Schema subset is supported (type, enum, const, properties, required,
additionalProperties, items, min/max length, items and bounds). A schema using anything else is
refused when the checker is built, so an unsupported rule is never silently passed.
"""

from __future__ import annotations

import json
from typing import Any, Final

SUPPORTED: Final = frozenset(
    {
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "minItems",
        "maxItems",
        "description",
        "title",
        "$schema",
    }
)

_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
}


class UnsupportedSchema(ValueError):
    pass


def check_schema(schema: Any, where: str = "$") -> None:
    if not isinstance(schema, dict):
        raise UnsupportedSchema(f"schema at {where} must be an object")
    unknown = set(schema) - SUPPORTED
    if unknown:
        raise UnsupportedSchema(f"schema at {where} uses unsupported keywords: {sorted(unknown)}")
    for name, sub in (schema.get("properties") or {}).items():
        check_schema(sub, f"{where}.{name}")
    if isinstance(schema.get("items"), dict):
        check_schema(schema["items"], f"{where}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        check_schema(schema["additionalProperties"], f"{where}.*")


def _is_type(value: Any, name: str) -> bool:
    if isinstance(value, bool) and name in ("number", "integer"):
        return False
    return isinstance(value, _TYPES[name])


def validate(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    errors: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_is_type(value, k) for k in kinds):
            return [f"{where}: expected {' or '.join(kinds)}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is not one of {schema['enum']!r}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{where}: must equal {schema['const']!r}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{where}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{where}: longer than {schema['maxLength']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: above {schema['maximum']}")
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties") or {}
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{where}: missing required property {name!r}")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in props:
                errors.extend(validate(item, props[name], f"{where}.{name}"))
            elif extra is False:
                errors.append(f"{where}: property {name!r} is not allowed")
            elif isinstance(extra, dict):
                errors.extend(validate(item, extra, f"{where}.{name}"))
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{where}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{where}: more than {schema['maxItems']} items")
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                errors.extend(validate(item, schema["items"], f"{where}[{i}]"))
    return errors


def structured_output_errors(text: str, schema: dict[str, Any]) -> list[str]:
    """Why `text` is not valid structured output; empty when it is."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return [f"the answer is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"]
    return validate(value, schema)
