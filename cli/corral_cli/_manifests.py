"""Read Agent and Session YAML the way `kubectl apply` and the API server would judge it.

The same pydantic models that generate the CRDs validate here, and their errors are worded as
the API server words a rejected object (`<field path>: <what is wrong>`), so a mistake reads the
same whether it was made for `corral run` or for the cluster. The CEL rules of the CRDs are
re-stated in `_rules` and checked after the schema.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
import yaml

from corral_api import API_VERSION, KIND_BY_NAME, VERSION, Agent, Session
from corral_api._base import Resource
from corral_common.branches import session_refusal

from ._rules import cel_violations

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ManifestError(Exception):
    """Input that the API server would refuse; the message is what a user should read."""


@dataclass
class Manifests:
    agents: dict[str, Agent] = field(default_factory=dict)
    sessions: list[Session] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # "Kind/name" of kinds run does not run


def _json(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return json.dumps(str(value))


def field_path(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _json_type(value: Any) -> str:
    """The JSON type of a value, as the API server names it in a type error."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "null"


_EXPECTED_TYPE = {
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "string": "string",
    "list": "array",
    "dict": "object",
    "model": "object",
}


def api_server_message(error: Any) -> str:
    """One pydantic error, worded as kube-apiserver words the same schema violation."""
    path = field_path(error["loc"])
    kind: str = error["type"]
    value = error.get("input")
    ctx = error.get("ctx") or {}
    invalid = f"{path}: Invalid value: {_json(value)}: {path} in body"
    if kind == "missing":
        return f"{path}: Required value"
    if kind == "extra_forbidden":
        return f'unknown field "{path}"'
    if kind == "literal_error":
        options = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        supported = ", ".join(f'"{o}"' for o in options)
        return f"{path}: Unsupported value: {_json(value)}: supported values: {supported}"
    if kind in ("less_than_equal", "less_than"):
        op = "less than or equal to" if kind == "less_than_equal" else "less than"
        return f"{invalid} should be {op} {ctx.get('le', ctx.get('lt'))}"
    if kind in ("greater_than_equal", "greater_than"):
        op = "greater than or equal to" if kind == "greater_than_equal" else "greater than"
        return f"{invalid} should be {op} {ctx.get('ge', ctx.get('gt'))}"
    if kind == "string_too_short":
        return f"{invalid} should be at least {ctx.get('min_length')} chars long"
    if kind == "string_too_long":
        return f"{path}: Too long: may not be more than {ctx.get('max_length')} bytes"
    if kind == "too_long":
        most = ctx.get("max_length")
        return f"{path}: Too many: {ctx.get('actual_length')}: must have at most {most} items"
    if kind == "string_pattern_mismatch":
        return f"{invalid} should match '{ctx.get('pattern')}'"
    expected = _EXPECTED_TYPE.get(kind.removesuffix("_type").removesuffix("_parsing"))
    if expected is not None and (kind.endswith("_type") or kind.endswith("_parsing")):
        actual = _json_type(value)
        return (
            f'{path}: Invalid value: "{actual}": {path} in body must be of type {expected}: '
            f'"{actual}"'
        )
    return f"{path}: Invalid value: {_json(value)}: {error.get('msg', 'is invalid')}"


def _invalid(kind: str, name: str, problems: list[str]) -> ManifestError:
    head = f'The {kind} "{name}" is invalid:'
    if len(problems) == 1:
        return ManifestError(f"{head} {problems[0]}")
    return ManifestError("\n".join([head, *(f"* {p}" for p in problems)]))


def validate_resource(doc: Any, source: str) -> Resource:
    """Validate one YAML document as a corral.dev resource, or raise ManifestError."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{source}: a document must be an object, not {type(doc).__name__}")
    kind = doc.get("kind")
    version = doc.get("apiVersion")
    if not kind or not version:
        missing = "kind" if not kind else "apiVersion"
        raise ManifestError(f"{source}: Object 'Kind' is missing: {missing} not set")
    model = KIND_BY_NAME.get(str(kind))
    if model is None or version != API_VERSION:
        raise ManifestError(
            f'{source}: resource mapping not found: no matches for kind "{kind}" in version '
            f'"{version}"; ensure CRDs are installed first'
        )
    metadata = doc.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, dict) else None
    label = str(name or "")
    problems: list[str] = []
    if not name:
        problems.append("metadata.name: Required value: name or generateName is required")
    elif not isinstance(name, str) or len(name) > 253 or not _NAME.match(name):
        problems.append(
            f"metadata.name: Invalid value: {_json(name)}: a lowercase RFC 1123 subdomain must "
            "consist of lower case alphanumeric characters, '-' or '.', and must start and end "
            "with an alphanumeric character"
        )
    try:
        resource = model.model_validate(doc, strict=True)
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        unknown = [e for e in errors if e["type"] == "extra_forbidden"]
        if unknown:
            # The API server refuses unknown fields while decoding, before it validates.
            fields = ", ".join(sorted(api_server_message(e) for e in unknown))
            raise ManifestError(
                f'{kind} in version "{VERSION}" cannot be handled as a {kind}: '
                f"strict decoding error: {fields}"
            ) from None
        problems += [api_server_message(e) for e in errors]
        raise _invalid(str(kind), label, problems) from None
    problems += cel_violations(resource)
    if problems:
        raise _invalid(str(kind), label, problems)
    return resource


STDIN = Path("-")
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def expand_paths(paths: Sequence[Path], *, recursive: bool = False) -> list[Path]:
    """`-f` as kubectl reads it: a file; `-` for stdin (once); a directory for every *.yaml,
    *.yml and *.json in it, sorted, its subdirectories too only when `recursive` (-R)."""
    out: list[Path] = []
    for path in paths:
        if path == STDIN:
            if STDIN in out:
                raise ManifestError("-f - reads stdin, which can be read once: give it once")
            out.append(path)
        elif path.is_dir():
            found = path.rglob("*") if recursive else path.glob("*")
            files = sorted(p for p in found if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
            if not files:
                where = "or below it " if recursive else ""
                raise ManifestError(
                    f"the directory {str(path)!r} has no *.yaml, *.yml or *.json {where}to read"
                )
            out.extend(files)
        else:
            out.append(path)
    return out


def manifest_dir(path: Path) -> Path:
    """The directory a `-f` argument stands for (what relative paths in it, and Agents next to
    it, are found against): a directory itself, stdin's the working directory, a file's own."""
    if path == STDIN:
        return Path.cwd()
    resolved = path.resolve()
    return resolved if resolved.is_dir() else resolved.parent


def _documents(path: Path) -> Iterable[Any]:
    if path == STDIN:
        text = sys.stdin.read()
        name = "<stdin>"
    else:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ManifestError(f"the path {str(path)!r} cannot be read: {exc.strerror}") from None
        name = str(path)
    try:
        docs = list(yaml.safe_load_all(text))  # JSON is YAML too
    except yaml.YAMLError as exc:
        raise ManifestError(f"error parsing {name}: {exc}") from None
    out: list[Any] = []
    for doc in docs:
        # A `kind: List` (what `corral get -o yaml` prints) holds its objects in items.
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "List"
            and isinstance(doc.get("items"), list)
        ):
            out.extend(doc["items"])
        elif doc is not None:
            out.append(doc)
    return out


def load_manifests(paths: Sequence[Path], *, recursive: bool = False) -> Manifests:
    out = Manifests()
    for path in expand_paths(paths, recursive=recursive):
        label = "<stdin>" if path == STDIN else str(path)
        for index, doc in enumerate(_documents(path)):
            source = f"{label} (document {index + 1})"
            resource = validate_resource(doc, source)
            name = str(doc["metadata"]["name"])  # validated above
            if isinstance(resource, Agent):
                out.agents[name] = resource
            elif isinstance(resource, Session):
                out.sessions.append(resource)
            else:
                out.ignored.append(f"{resource.info.kind}/{name}")
    return out


def agent_nearby(directory: Path, name: str) -> tuple[Agent, Path] | None:
    """The Agent `name` from a YAML file in `directory`, as `kubectl apply -f <dir>` would see.

    Files that do not parse, and documents of other kinds or names, are passed over; the Agent
    found is validated like any other.
    """
    for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
        try:
            docs = list(yaml.safe_load_all(path.read_text()))
        except (OSError, yaml.YAMLError):
            continue
        for index, doc in enumerate(docs):
            if not isinstance(doc, dict) or doc.get("kind") != "Agent":
                continue
            if (doc.get("metadata") or {}).get("name") != name:
                continue
            resource = validate_resource(doc, f"{path} (document {index + 1})")
            assert isinstance(resource, Agent)
            return resource, path
    return None


def check_session_branch(session: Session, agent: Agent) -> None:
    """`corral run` holds a Session to its Agent's branch patterns as the operator does
    (corral_common.branches): outside them, it does not start."""
    refused = session_refusal(session, agent)
    if refused is not None:
        raise ManifestError(f'Session "{session.metadata["name"]}" is invalid: {refused}')


def pick_session(found: Manifests, search: Sequence[Path] = ()) -> tuple[Session, Agent]:
    """The one Session to run and the Agent it names (given, or found in `search` dirs)."""
    if not found.sessions:
        raise ManifestError("no Session found: -f must hold one Session")
    if len(found.sessions) > 1:
        names = ", ".join(str(s.metadata["name"]) for s in found.sessions)
        raise ManifestError(f"corral run runs one Session at a time; found {names}")
    session = found.sessions[0]
    agent = found.agents.get(session.spec.agent_ref)
    for directory in search:
        if agent is not None:
            break
        nearby = agent_nearby(directory, session.spec.agent_ref)
        if nearby is not None:
            agent = nearby[0]
            found.agents[session.spec.agent_ref] = agent
    if agent is None:
        known = ", ".join(sorted(found.agents)) or "none"
        raise ManifestError(
            f'agents.corral.dev "{session.spec.agent_ref}" not found (the Session '
            f'"{session.metadata["name"]}" names it in spec.agentRef; Agents given: {known}); '
            "pass it with --agent or in the -f file"
        )
    return session, agent
