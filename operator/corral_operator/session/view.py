"""A Session as its loop last knew it, without a GET per pass.

kopf hands a daemon the Session's live body: replaced by every watch event. That body may lag
the loop's own writes (the watch has not delivered them yet), and planning from it would then
repeat a transition (its Events, its writes). So the view keeps the body the API server
returned for the loop's last read or write, and the resourceVersions those carried:

- the live body carries one of those versions: nobody else wrote since; the kept body is at
  least as new, and is used;
- the live body carries another version but the status the loop last knew: someone else
  wrote, though not the status (kopf's finalizer, a person's reply); the loop writes nothing
  but the status, so the live body misses none of its writes, and is used (the commonest
  case: kopf adds its finalizer while the first pass writes); its spec may lag one the loop
  read from the server, as any watch's may, and the next pass sees the newer one;
- the live body carries another version and a status the loop knew before its last write:
  the watch lags behind that write, and shows someone else's earlier write (kopf's finalizer,
  landing just before the loop's first status write); the server applied the loop's write on
  top of it, so the kept body is newer in every part, and is used;
- the live body carries another version and another status: someone else wrote (a person,
  the custodian) and the live body may still miss the loop's own last write; the Session is
  read from the API server;
- nothing kept yet (the loop's first pass): the live body is used as the watch delivered it.

Only equality of resourceVersions is used, never their order (the API's rule).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, cast

from ..kopfext.diffbase import json_copy
from ..kube import Kube

# Versions of the loop's own reads and writes kept for comparison: a watch lags by a few.
_KEPT_VERSIONS = 16
# Statuses the loop knew before its last read or write, for a lagging watch.
_KEPT_STATUSES = 4


def _version(body: Mapping[str, Any] | None) -> str:
    md = (body or {}).get("metadata") or {}
    return str(md.get("resourceVersion") or "")


class SessionView:
    def __init__(self, kube: Kube, path: str, live: Mapping[str, Any] | None = None) -> None:
        self._kube = kube
        self._path = path
        self._live = live
        self._known: dict[str, Any] | None = None
        self._own: deque[str] = deque(maxlen=_KEPT_VERSIONS)
        self._earlier: deque[Any] = deque(maxlen=_KEPT_STATUSES)

    def _copy(self) -> dict[str, Any]:
        return cast(dict[str, Any], json_copy(self._known))

    def _keep(self, body: Mapping[str, Any]) -> None:
        # managedFields are most of a Session's metadata and nothing a pass reads.
        metadata = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
        if self._known is not None:
            self._earlier.append(self._known.get("status"))
        self._known = json_copy({**body, "metadata": metadata})
        version = _version(body)
        if version:
            self._own.append(version)

    async def read(self) -> dict[str, Any] | None:
        """The Session, newest of what the loop wrote and what the watch delivered; None once
        it is gone."""
        live_version = _version(self._live)
        live = self._live
        if (
            live is not None
            and live_version
            and (
                self._known is None
                or (
                    live_version not in self._own
                    and live.get("status") == self._known.get("status")
                )
            )
        ):
            self._keep(live)
        elif self._known is None or (live_version not in self._own and not self._lags(live)):
            body = await self._kube.get(self._path)
            if body is None:
                self._known = None
                return None
            self._keep(body)
        return self._copy()  # the caller's to change

    def _lags(self, live: Mapping[str, Any] | None) -> bool:
        """Whether `live` shows a status the loop knew before its last read or write."""
        return live is not None and any(live.get("status") == old for old in self._earlier)

    async def patch_status(self, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status; the answer (the whole Session) becomes the kept body."""
        patched = await self._kube.patch_status(self._path, patch)
        if patched.get("metadata"):
            self._keep(patched)
        return patched
