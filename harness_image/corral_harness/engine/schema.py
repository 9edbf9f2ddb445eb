"""A small JSON-schema check for tool arguments: the subset the tools' schemas use.

The engine checks a call's arguments before it asks the turn about the call, so a call with bad
arguments gets the engine's own error and never counts as a pick.
"""

from __future__ import annotations

from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def check_arguments(schema: dict[str, Any], value: Any, where: str = "input") -> str | None:
    """None when `value` fits `schema`, else the first problem, in words."""
    expected = schema.get("type")
    if isinstance(expected, str) and expected in _TYPES:
        ok = isinstance(value, _TYPES[expected])
        if expected in ("integer", "number") and isinstance(value, bool):
            ok = False
        if not ok:
            return f"{where} must be of type {expected}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        minimum = schema.get("minimum")
        if minimum is not None and value < minimum:
            return f"{where} must be at least {minimum}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {schema['enum']}"
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                return f"{where} is missing the required field {key!r}"
        for key, item in value.items():
            if key in props:
                problem = check_arguments(props[key], item, f"{where}.{key}")
                if problem:
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"{where} has an unknown field {key!r}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = check_arguments(schema["items"], item, f"{where}[{i}]")
            if problem:
                return problem
    return None
