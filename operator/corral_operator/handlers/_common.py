"""What every handler module needs: the shared Runtime from kopf's memo, and a clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..runtime import Runtime


def runtime(memo: Any) -> Runtime:
    found = getattr(memo, "runtime", None)
    if not isinstance(found, Runtime):
        raise RuntimeError("the operator's runtime is not set up (startup did not run)")
    return found


def namespace_of(namespace: str | None) -> str:
    """The namespace kopf names for an object of one of Corral's kinds (all namespaced)."""
    if namespace is None:
        raise RuntimeError("an object of a namespaced kind came without its namespace")
    return namespace


def now() -> datetime:
    return datetime.now(UTC)


def plain(body: Any) -> dict[str, Any]:
    """kopf's read-only Body as a plain dict the planners can read."""
    return {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec", "status")}
