"""The operator's kopf diff-base: the same essence as kopf's own, without copying status."""

from __future__ import annotations

from typing import Any, cast

import kopf

from corral_operator.kopfext.diffbase import LeanAnnotationsDiffBaseStorage, essence_needed

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


def test_no_essence_is_built_when_no_handler_reads_the_diff() -> None:
    storage = LeanAnnotationsDiffBaseStorage(prefix=PREFIX, key=KEY, needed=False)
    assert storage.build(body=kopf.Body(cast(kopf.RawBody, _session()))) == {}


def test_the_operators_handlers_read_no_diff() -> None:
    # Every handler the operator registers is a daemon or an event handler: kopf's diff of
    # an object's essence is read by none, so none is built (main._startup).
    from corral_operator import handlers  # noqa: F401  (registers every handler)

    assert essence_needed(kopf.get_default_registry()) is False


def test_a_change_handler_or_an_idling_timer_needs_the_essence() -> None:
    registry = kopf.OperatorRegistry()
    assert essence_needed(registry) is False
    kopf.on.update("corral.dev", "v1alpha1", "sessions", registry=registry)(lambda **_: None)
    assert essence_needed(registry) is True
    timed = kopf.OperatorRegistry()
    kopf.timer("corral.dev", "v1alpha1", "goals", idle=5.0, registry=timed)(lambda **_: None)
    assert essence_needed(timed) is True
