"""`next_version_crd`: a kind's CRD with the next version served beside the stored one, the path
docs/api-versions.md documents (its behaviour on a real API server: tests/cluster/
test_crd_versions.py)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from corral_api import crdgen
from corral_api._base import VERSION
from corral_api.kinds import KINDS, Session

PRIORITY = {"type": "integer", "minimum": 0, "description": "Higher runs first."}
ADDED = {"spec": {"priority": PRIORITY}, "status": {"queuedAt": {"type": "string"}}}


def _by_name(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in crd["spec"]["versions"]}


def _properties(version: dict[str, Any], part: str) -> dict[str, Any]:
    return dict(version["schema"]["openAPIV3Schema"]["properties"][part]["properties"])


@pytest.mark.parametrize("model", KINDS, ids=lambda m: m.info.kind)
def test_both_versions_are_served_and_exactly_one_is_stored(model: Any) -> None:
    for storage in (VERSION, crdgen.NEXT_VERSION):
        crd = crdgen.next_version_crd(model, storage=storage)
        versions = crd["spec"]["versions"]
        assert [v["name"] for v in versions] == ["v1alpha1", "v1alpha2"]
        assert all(v["served"] is True for v in versions)
        assert [v["name"] for v in versions if v["storage"]] == [storage]
        assert crd["spec"]["conversion"] == {"strategy": "None"}


@pytest.mark.parametrize("model", KINDS, ids=lambda m: m.info.kind)
def test_everything_but_name_and_storage_is_the_one_version_crd(model: Any) -> None:
    """Columns, the status subresource, the schema, names, short names and categories: what
    `make crds` renders today, once per version."""
    today = crdgen.crd_of(model)
    (current,) = today["spec"]["versions"]
    crd = crdgen.next_version_crd(model)
    for version in crd["spec"]["versions"]:
        assert {k: v for k, v in version.items() if k not in ("name", "storage")} == {
            k: v for k, v in current.items() if k not in ("name", "storage")
        }
    for version in crd["spec"]["versions"]:
        assert version["additionalPrinterColumns"] == current["additionalPrinterColumns"]
        assert version["subresources"] == {"status": {}}
    assert {k: v for k, v in crd["spec"].items() if k not in ("versions", "conversion")} == {
        k: v for k, v in today["spec"].items() if k != "versions"
    }
    assert crd["metadata"] == today["metadata"]


def test_added_fields_are_in_both_schemas_where_asked_and_nowhere_else() -> None:
    crd = crdgen.next_version_crd(Session, ADDED, storage=crdgen.NEXT_VERSION)
    (before,) = crdgen.crd_of(Session)["spec"]["versions"]
    for version in _by_name(crd).values():
        spec, status = _properties(version, "spec"), _properties(version, "status")
        assert spec.pop("priority") == PRIORITY
        assert status.pop("queuedAt") == {"type": "string"}
        # Optional: a write through either version may leave them out.
        schema = version["schema"]["openAPIV3Schema"]["properties"]
        assert "priority" not in schema["spec"].get("required", [])
        assert "queuedAt" not in schema["status"].get("required", [])
        # Everything else is the model's schema, field for field.
        assert spec == _properties(before, "spec")
        assert status == _properties(before, "status")
    # The caller's schemas are copied, not shared between versions or with the caller.
    v1, v2 = crd["spec"]["versions"]
    v1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["priority"]["minimum"] = 5
    assert v2["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["priority"] == (
        PRIORITY
    )
    assert PRIORITY["minimum"] == 0


def test_the_generated_files_still_serve_one_version() -> None:
    for text in crdgen.render_all().values():
        assert "v1alpha2" not in text
        assert "conversion:" not in text


@pytest.mark.parametrize(
    ("added", "storage", "message"),
    [
        ({"spec": {"task": {"type": "integer"}}}, VERSION, "spec already has ['task']"),
        ({"status": {"phase": {"type": "string"}}}, VERSION, "status already has ['phase']"),
        ({"metadata": {"x": {"type": "string"}}}, VERSION, "spec or status"),
        ({}, "v1beta1", "storage must be v1alpha1 or v1alpha2"),
    ],
)
def test_a_change_that_conversion_none_cannot_carry_is_refused(
    added: dict[str, Any], storage: str, message: str
) -> None:
    before = copy.deepcopy(added)
    with pytest.raises(ValueError, match=re.escape(message)):
        crdgen.next_version_crd(Session, added, storage=storage)
    assert added == before
