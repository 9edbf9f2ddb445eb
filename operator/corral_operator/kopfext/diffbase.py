"""kopf's diff-base and progress storage, built without copying what they throw away.

kopf computes an object's "essence" on every watch event of every kind it handles:
everything but apiVersion, kind, status and metadata
other than labels and annotations. Its stock `build` deep-copies the whole body first and then
drops those parts; a Session's status and managedFields are most of its body, and at 1,000
Sessions that copy was the largest item in the operator's profile (docs/performance.md,
"1,000 Sessions"). This storage hands kopf's own `build` only the parts it keeps, so the
essence is the same and the copy is small.

Both also copy with `json_copy` instead of `copy.deepcopy`: a body is a tree of dicts, lists
and immutable scalars, and deepcopy's generality (a memo, a dispatch per node) made it the next
largest item of the same profile (docs/performance.md, item 10).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import kopf

_KEPT_METADATA = ("labels", "annotations")
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON-shaped value (dicts, lists, scalars); anything else is shared."""
    if isinstance(value, dict):
        return {key: json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_copy(item) for item in value]
    return value


def essence_needed(registry: kopf.OperatorRegistry) -> bool:
    """Whether any handler reads kopf's diff of an object's essence: a change handler (create,
    update, resume, delete, field) or a timer that idles until nothing changed. Daemons and
    event handlers do not; kopf builds the essence of every event of every kind regardless."""
    if registry._changing.get_all_handlers():
        return True
    return any(
        getattr(handler, "idle", None) is not None
        for handler in registry._spawning.get_all_handlers()
    )


class LeanAnnotationsDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    def __init__(self, *, needed: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # False (no handler reads the diff, `essence_needed`): every event's essence is empty,
        # a deep copy of each Session's and pod's spec saved at every watch event.
        self.needed = needed

    def build(
        self,
        *,
        body: kopf.Body,
        extra_fields: Iterable[kopf.FieldSpec] | None = None,
    ) -> kopf.BodyEssence:
        if not self.needed:
            return cast(kopf.BodyEssence, {})
        if extra_fields or self.ignored_fields:
            # A field handler may watch a status field: let kopf copy all it might need.
            return super().build(body=body, extra_fields=extra_fields)
        # kopf's own `build`, step for step, over the parts it keeps.
        metadata = body.get("metadata") or {}
        essence: dict[str, Any] = {
            key: json_copy(value)
            for key, value in body.items()
            if key not in ("apiVersion", "kind", "status", "metadata")
        }
        picked = {key: json_copy(metadata[key]) for key in _KEPT_METADATA if key in metadata}
        if picked:
            essence["metadata"] = picked
        annotations = picked.get("annotations") or {}
        ignored = self._detect_marked_prefixes(annotations)
        for annotation in list(annotations):
            if annotation == _LAST_APPLIED or any(
                annotation.startswith(f"{prefix}/") for prefix in ignored
            ):
                del annotations[annotation]
        built = cast(kopf.BodyEssence, essence)
        self.remove_empty_stanzas(built)
        # What kopf's AnnotationsDiffBaseStorage adds to the base's build: its own key goes.
        self.remove_annotations(built, set(self.make_keys(self.key, body=body)))
        self.remove_empty_stanzas(built)
        return built


class LeanAnnotationsProgressStorage(kopf.AnnotationsProgressStorage):
    def clear(self, *, essence: kopf.BodyEssence) -> kopf.BodyEssence:
        # kopf's own `clear`, with a cheaper copy: its progress annotations leave the essence.
        cleared = cast(kopf.BodyEssence, json_copy(essence))
        annotations = cleared.get("metadata", {}).get("annotations", {})
        keys = {key for key in annotations if self.prefix and key.startswith(f"{self.prefix}/")}
        self.remove_annotations(cleared, keys)
        self.remove_empty_stanzas(cleared)
        return cleared
