"""The CRDs are derived from the models, structural, and cannot drift from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from corral_api import crdgen
from corral_api.kinds import KINDS

ROOT = Path(__file__).resolve().parents[3]


def _walk(node: Any, path: str = "") -> list[tuple[str, str, Any]]:
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            found.append((path, key, value))
            found.extend(_walk(value, f"{path}.{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_walk(value, f"{path}[{i}]"))
    return found


def test_committed_crds_match_the_models() -> None:
    rendered = crdgen.render_all()
    for directory in (ROOT / "crds", ROOT / "charts" / "corral" / "crds"):
        on_disk = {p.name: p.read_text() for p in directory.glob("corral.dev_*.yaml")}
        assert on_disk == rendered, f"{directory} drifted; run `make crds`"


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    assert crdgen.main([str(tmp_path), "--check"]) == 1
    assert crdgen.main([str(tmp_path)]) == 0
    assert crdgen.main([str(tmp_path), "--check"]) == 0
    victim = next(tmp_path.glob("*.yaml"))
    victim.write_text(victim.read_text().replace("description", "descripton", 1))
    assert crdgen.main([str(tmp_path), "--check"]) == 1


# The only free-form JSON: a user's JSON Schema (in a Session's spec, and so in a Goal's
# sessionTemplate) and the answer validated against it (ADR 0070).
FREE_FORM = (".spec.properties.outputSchema", "Session.properties.status.properties.output")


def test_schemas_are_structural() -> None:
    for model in KINDS:
        schema = crdgen.schema_of(model)
        for path, key, value in _walk(schema):
            assert key not in {"$ref", "$defs", "anyOf", "allOf", "oneOf", "title"}, (path, key)
            if key == "x-kubernetes-preserve-unknown-fields":
                where = f"{model.info.kind}{path}"
                assert where.endswith(FREE_FORM), f"{where} preserves unknown fields"
            if key == "properties":
                for name, sub in value.items():
                    untyped_ok = sub.get("x-kubernetes-preserve-unknown-fields") is True
                    assert "type" in sub or untyped_ok, f"{model.info.kind}{path}.{name}: no type"


def test_every_spec_field_has_a_description() -> None:
    for model in KINDS:
        spec = crdgen.schema_of(model)["properties"]["spec"]
        for path, key, value in _walk(spec):
            if key == "properties":
                for name, sub in value.items():
                    assert sub.get("description"), f"{model.info.kind}.spec{path}.{name}"


def test_every_kind_has_conditions_columns_short_names_and_category() -> None:
    for model in KINDS:
        crd = crdgen.crd_of(model)
        names = crd["spec"]["names"]
        version = crd["spec"]["versions"][0]
        assert names["shortNames"] and names["categories"] == ["corral"]
        assert version["subresources"] == {"status": {}}
        assert any(c["name"] == "Age" for c in version["additionalPrinterColumns"])
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        condition = status["properties"]["conditions"]["items"]["properties"]
        assert {
            "type",
            "status",
            "reason",
            "message",
            "lastTransitionTime",
            "observedGeneration",
        } <= set(condition)


def test_cel_rules_reach_the_schema() -> None:
    text = yaml.safe_dump(crdgen.crd_of(KINDS[1]))
    assert "a read-only session cannot have a branch to push to" in text
    assert "set exactly one of substring or command" in text
