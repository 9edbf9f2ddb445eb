"""Derive CustomResourceDefinitions from the pydantic models.

Pydantic's JSON Schema is turned into a Kubernetes *structural* schema: `$ref`s inlined,
`Optional` unwrapped, `title`s dropped, defaults kept only where the API server can apply them,
and CEL rules carried through. Run `python -m corral_api.crdgen` (or `make crds`).

`next_version_crd` renders a kind with the next version served beside the stored one: the path
docs/api-versions.md documents for the day a kind gains a version; the generated files serve
v1alpha1 alone.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ._base import GROUP, VERSION, Resource
from .kinds import KINDS

_DROP = {"title", "discriminator"}
NEXT_VERSION = "v1alpha2"


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        rest = {k: v for k, v in node.items() if k != "$ref"}
        target.update(rest)  # a field's description overrides the model's
        return _resolve(target, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "properties":
            out[key] = {name: _resolve(v, defs) for name, v in value.items()}
        else:
            out[key] = _resolve(value, defs)
    return out


def _structural(node: Any) -> Any:
    """Unwrap Optional (anyOf with null), drop null defaults, make enums/consts plain."""
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express union in a structural schema: {options}")
        merged = dict(options[0])
        merged.update(node)
        node = merged
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("default", 0) is None:
        node.pop("default")
    # Defaults of objects and lists are applied from the nested fields' own defaults.
    if node.get("type") in ("object", "array") and "default" in node:
        node.pop("default")
    if node.get("type") == "object" and "properties" in node:
        node.pop("additionalProperties", None)
    return {k: _structural(v) for k, v in node.items()}


def schema_of(model: type[Resource]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    resolved = _resolve(raw, defs)
    props = resolved["properties"]
    spec = _structural(props["spec"])
    status = _structural(props["status"])
    return {
        "type": "object",
        "description": model.info.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def crd_of(model: type[Resource]) -> dict[str, Any]:
    info = model.info
    columns = []
    for c in info.columns:
        column: dict[str, Any] = {"name": c.name, "type": c.type, "jsonPath": c.json_path}
        if c.description:
            column["description"] = c.description
        if c.priority:
            column["priority"] = c.priority
        columns.append(column)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{info.plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "corral"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": info.kind,
                "listKind": f"{info.kind}List",
                "plural": info.plural,
                "singular": info.kind.lower(),
                "shortNames": list(info.short_names),
                "categories": list(info.categories),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema_of(model)},
                }
            ],
        },
    }


def next_version_crd(
    model: type[Resource],
    added: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    storage: str = VERSION,
) -> dict[str, Any]:
    """`model`'s CRD serving VERSION and NEXT_VERSION with conversion `None`, `storage` the one
    stored. `added` maps "spec" or "status" to new optional fields' schemas (for a field not yet
    in the model). They go into both versions' schemas: with `None` the API server only relabels
    apiVersion and prunes each version's view to its own schema, so a field only the next
    version knew would be erased by every write made through the previous one
    (tests/cluster/test_crd_versions.py shows it). Columns, the status subresource and the names
    are the same for both versions."""
    if storage not in (VERSION, NEXT_VERSION):
        raise ValueError(f"storage must be {VERSION} or {NEXT_VERSION}, not {storage!r}")
    crd = crd_of(model)
    (current,) = crd["spec"]["versions"]
    root = current["schema"]["openAPIV3Schema"]["properties"]
    for part, fields in (added or {}).items():
        if part not in ("spec", "status"):
            raise ValueError(f"fields are added to spec or status, not {part!r}")
        known = root[part].setdefault("properties", {})
        # Conversion `None` carries additions only: a changed field needs a webhook.
        if changed := sorted(set(fields) & set(known)):
            raise ValueError(f"{part} already has {changed}: only new fields can be added")
        known.update(copy.deepcopy(dict(fields)))
    crd["spec"]["versions"] = [
        {**copy.deepcopy(current), "name": name, "storage": name == storage}
        for name in (VERSION, NEXT_VERSION)
    ]
    crd["spec"]["conversion"] = {"strategy": "None"}
    return crd


HEADER = "# Generated by `make crds` from corral_api.kinds. Do not edit by hand.\n"


def render_all() -> dict[str, str]:
    """File name -> YAML text for every kind."""
    out = {}
    for model in KINDS:
        crd = crd_of(model)
        text = yaml.safe_dump(crd, sort_keys=False, width=100)
        out[f"{GROUP}_{model.info.plural}.yaml"] = HEADER + text
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path, help="directories to write CRDs into")
    parser.add_argument("--check", action="store_true", help="fail if any file differs")
    args = parser.parse_args(argv)
    rendered = render_all()
    drift = []
    for directory in args.dirs:
        existing = {p.name for p in directory.glob(f"{GROUP}_*.yaml")}
        for name, text in rendered.items():
            path = directory / name
            current = path.read_text() if path.exists() else None
            if current != text:
                drift.append(str(path))
                if not args.check:
                    directory.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
        for stale in existing - set(rendered):
            drift.append(str(directory / stale))
            if not args.check:
                (directory / stale).unlink()
    if args.check and drift:
        print("generated CRDs are out of date; run `make crds`:", *drift, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
