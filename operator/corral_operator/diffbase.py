"""kopf's diff-base, built without copying what it throws away.

kopf computes an object's "essence" on every watch event of a kind with change handlers (a
Session has one: its deletion handler): everything but apiVersion, kind, status and metadata
other than labels and annotations. Its stock `build` deep-copies the whole body first and then
drops those parts; a Session's status and managedFields are most of its body, and at 1,000
Sessions that copy was the largest item in the operator's profile (docs/performance.md,
"1,000 Sessions"). This storage hands kopf's own `build` only the parts it keeps, so the
essence is the same and the copy is small.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import kopf

_KEPT_METADATA = ("labels", "annotations")


class LeanAnnotationsDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    def build(
        self,
        *,
        body: kopf.Body,
        extra_fields: Iterable[kopf.FieldSpec] | None = None,
    ) -> kopf.BodyEssence:
        if extra_fields:
            # A field handler may watch a status field: let kopf copy all it might need.
            return super().build(body=body, extra_fields=extra_fields)
        metadata = body.get("metadata") or {}
        kept: dict[str, Any] = {
            key: value for key, value in body.items() if key not in ("status", "metadata")
        }
        kept["metadata"] = {key: metadata[key] for key in _KEPT_METADATA if key in metadata}
        return super().build(body=kopf.Body(cast(kopf.RawBody, kept)))
