"""The operator's kopf diff-base: the same essence as kopf's own, without copying status."""

from __future__ import annotations

from typing import Any, cast

import kopf

from corral_operator.diffbase import LeanAnnotationsDiffBaseStorage

PREFIX, KEY = "corral.dev", "last-handled-configuration"


def _session() -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {
            "name": "s1",
            "uid": "u-1",
            "resourceVersion": "42",
            "labels": {"team": "a"},
            "annotations": {"note": "kept", f"{PREFIX}/{KEY}": '{"spec": {}}'},
            "finalizers": ["corral.dev/finalizer"],
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:task": {}}}}],
        },
        "spec": {"agentRef": "coder", "task": "t", "workspace": {"repo": "/r"}},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_the_essence_is_kopfs_own() -> None:
    raw = cast(kopf.RawBody, _session())
    stock = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX, key=KEY).build(body=kopf.Body(raw))
    lean = LeanAnnotationsDiffBaseStorage(prefix=PREFIX, key=KEY).build(body=kopf.Body(raw))
    assert lean == stock
    assert "status" not in lean and "managedFields" not in lean["metadata"]
    assert lean["metadata"]["annotations"] == {"note": "kept"}  # kopf's own key is not essence


def test_the_essence_is_a_copy() -> None:
    raw = _session()
    lean = LeanAnnotationsDiffBaseStorage(prefix=PREFIX, key=KEY).build(
        body=kopf.Body(cast(kopf.RawBody, raw))
    )
    raw["spec"]["task"] = "changed later"
    raw["metadata"]["labels"]["team"] = "b"
    assert lean["spec"]["task"] == "t" and lean["metadata"]["labels"] == {"team": "a"}


def test_a_field_handler_gets_the_stock_build() -> None:
    raw = cast(kopf.RawBody, _session())
    storage = LeanAnnotationsDiffBaseStorage(prefix=PREFIX, key=KEY)
    essence = storage.build(body=kopf.Body(raw), extra_fields=["status.phase"])
    assert essence["status"] == {"phase": "Running"}
