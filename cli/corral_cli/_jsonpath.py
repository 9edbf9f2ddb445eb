"""The part of kubectl's JSONPath that `corral get -o jsonpath=` and `-o custom-columns=` read
(docs/cli.md, "Output"): pure, objects in, text out.

A template is text with `{...}` expressions in it. An expression is a path from the current
object: `.a.b`, `['a.b']`, `[0]`, `[-1]`, `[*]`, `.*`, and a filter `[?(@.type=="Ready")]`
(`==` or `!=` against a quoted string, a number, true or false); `$` names the root. `{range
PATH}...{end}` repeats its body for each element, `{"\\n"}` is literal text. Not read: `..`
(recursive descent), slices with a step, and filters other than equality.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


class JsonPathError(ValueError):
    """A template this subset cannot read; the message says where."""


_MISSING = object()

# One step of a path: `.name`, `.*`, `[...]`.
_DOT = re.compile(r"\.([A-Za-z0-9_\-/]+|\*)")
_FILTER = re.compile(
    r"""\[\?\(@((?:\.[A-Za-z0-9_\-/]+)+)\s*(==|!=)\s*("(?:[^"\\]|\\.)*"|'[^']*'|[-\w.]+)\s*\)\]"""
)
_INDEX = re.compile(r"\[\s*(-?\d+|\*)\s*\]")
_KEY = re.compile(r"""\[\s*(?:'([^']*)'|"([^"]*)")\s*\]""")


@dataclass(frozen=True)
class _Step:
    kind: str  # "key", "index", "all", "filter"
    key: str = ""
    index: int = 0
    path: tuple[str, ...] = ()
    op: str = "=="
    value: Any = None


def _literal(text: str) -> Any:
    if text[0] == "'":
        return text[1:-1]
    if text[0] == '"':
        return json.loads(text)
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def parse_path(expr: str) -> list[_Step]:
    """The steps of one path (`$.items[*].metadata.name`, `.status.phase`)."""
    text = expr.strip()
    if text.startswith("$"):
        text = text[1:]
    if text and text[0] not in ".[":
        text = "." + text  # custom-columns accept `metadata.name`
    steps: list[_Step] = []
    at = 0
    while at < len(text):
        if text.startswith("..", at):
            raise JsonPathError(f"{expr!r}: recursive descent (..) is not supported")
        for pattern in (_DOT, _FILTER, _INDEX, _KEY):
            match = pattern.match(text, at)
            if match is None:
                continue
            if pattern is _DOT:
                name = match.group(1)
                steps.append(_Step("all") if name == "*" else _Step("key", key=name))
            elif pattern is _FILTER:
                path = tuple(match.group(1).strip(".").split("."))
                value = _literal(match.group(3))
                steps.append(_Step("filter", path=path, op=match.group(2), value=value))
            elif pattern is _INDEX:
                word = match.group(1)
                steps.append(_Step("all") if word == "*" else _Step("index", index=int(word)))
            else:
                steps.append(_Step("key", key=match.group(1) or match.group(2) or ""))
            at = match.end()
            break
        else:
            raise JsonPathError(f"{expr!r}: cannot read the path at {text[at:]!r}")
    return steps


def _follow(value: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


def evaluate(expr: str, obj: Any) -> list[Any]:
    """Every value the path reaches in `obj` (none when it reaches nothing)."""
    current = [obj]
    for step in parse_path(expr):
        found: list[Any] = []
        for value in current:
            if step.kind == "key":
                if isinstance(value, dict) and step.key in value:
                    found.append(value[step.key])
            elif step.kind == "index":
                if isinstance(value, list) and -len(value) <= step.index < len(value):
                    found.append(value[step.index])
            elif step.kind == "all":
                if isinstance(value, list):
                    found.extend(value)
                elif isinstance(value, dict):
                    found.extend(value.values())
            else:
                items = value if isinstance(value, list) else []
                for item in items:
                    got = _follow(item, step.path)
                    # A missing field is unequal to every value (so `!=` keeps the item).
                    if (got == step.value) == (step.op == "=="):
                        found.append(item)
        current = found
    return current


def text_of(value: Any) -> str:
    """A value as kubectl prints it: strings bare, everything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


# The pieces of a template: literal text, and `{...}` (a quoted string inside is literal).
_PIECE = re.compile(r"\{((?:\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^{}])*)\}")


def _pieces(template: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    at = 0
    for match in _PIECE.finditer(template):
        if match.start() > at:
            out.append(("text", template[at : match.start()]))
        inner = match.group(1).strip()
        if len(inner) >= 2 and inner[0] == inner[-1] and inner[0] in "\"'":
            out.append(("text", str(_literal(inner))))
        elif inner == "end":
            out.append(("end", ""))
        elif inner.startswith("range "):
            out.append(("range", inner[len("range ") :]))
        else:
            out.append(("path", inner))
        at = match.end()
    if at < len(template):
        out.append(("text", template[at:]))
    if any("{" in text or "}" in text for kind, text in out if kind == "text"):
        raise JsonPathError(f"{template!r}: an unclosed or nested brace")
    return out


def _render(pieces: list[tuple[str, str]], obj: Any) -> tuple[str, int]:
    """The text of `pieces` up to a matching {end}, and how many pieces that took."""
    out: list[str] = []
    at = 0
    while at < len(pieces):
        kind, text = pieces[at]
        if kind == "text":
            out.append(text)
        elif kind == "path":
            out.append(" ".join(text_of(v) for v in evaluate(text, obj)))
        elif kind == "range":
            body = pieces[at + 1 :]
            used = _render(body, None)[1]  # how far the body runs, whatever the items
            for item in evaluate(text, obj):
                out.append(_render(body, item)[0])
            at += used + 1
        else:  # end
            return "".join(out), at + 1
        at += 1
    return "".join(out), at


def render_template(template: str, obj: Any) -> str:
    """`-o jsonpath=TEMPLATE` applied to `obj` (the object, or the List of several)."""
    pieces = _pieces(template)
    depth = 0
    for kind, _ in pieces:
        depth += 1 if kind == "range" else -1 if kind == "end" else 0
        if depth < 0:
            raise JsonPathError(f"{template!r}: an {{end}} without a {{range}}")
    if depth:
        raise JsonPathError(f"{template!r}: a {{range}} without an {{end}}")
    return _render(pieces, obj)[0]


def parse_columns(spec: str) -> list[tuple[str, str]]:
    """`-o custom-columns=NAME:.metadata.name,PHASE:.status.phase` as (header, path) pairs."""
    columns: list[tuple[str, str]] = []
    for part in spec.split(","):
        header, sep, path = part.partition(":")
        if not sep or not header.strip() or not path.strip():
            raise JsonPathError(
                f"custom-columns {part!r}: each column is HEADER:PATH, e.g. NAME:.metadata.name"
            )
        path = path.strip()
        if path.startswith("{") and path.endswith("}"):
            path = path[1:-1]
        parse_path(path)  # refused here, before anything is fetched
        columns.append((header.strip(), path))
    return columns


def column_cell(path: str, obj: Any) -> str:
    """A custom column's cell: the values joined by commas, `<none>` when there are none."""
    values = evaluate(path, obj)
    return ",".join(text_of(v) for v in values) if values else "<none>"
