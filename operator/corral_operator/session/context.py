"""What the steps of one Session's loop share: the runtime, the Session's names and view, and
what the last pass learned (its pod's path, its ancestor chain, an object in the way)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any, Protocol

from corral_api.freeze import FrozenBy, covering_freeze

from .. import naming
from ..kube import Kube, corral_path, object_path
from ..runtime import Runtime, WatchedObjects
from .view import SessionView

# The custodian labels each child Session with its parent's uid (never trusted for depth).
PARENT_UID_LABEL = "corral.dev/parent-uid"


class StopFlag(Protocol):
    """kopf's DaemonStopped: truthy once the daemon should stop."""

    def __bool__(self) -> bool: ...


def sandbox_pod_path(body: dict[str, Any]) -> str:
    """The Session's pod: the one its status names (an adopted warm pod has its own name),
    else the name a cold pod gets. Either is used only while this Session controls it."""
    md = body["metadata"]
    name = (body.get("status") or {}).get("podName") or naming.pod_name(md["name"])
    return object_path("v1", "Pod", md["namespace"], str(name))


class LoopContext:
    """One Session as its loop's steps see it."""

    def __init__(
        self,
        runtime: Runtime,
        namespace: str,
        name: str,
        live: Mapping[str, Any] | None = None,
    ) -> None:
        self.rt = runtime
        self.kube: Kube = runtime.kube
        self.namespace = namespace
        self.name = name
        self.path = corral_path("Session", namespace, name)
        # The Session as kopf's watch (`live`) and this loop's own reads and writes know it.
        self.view = SessionView(self.kube, self.path, live)
        # Set when a create met an object in the way: the next pass looks the objects up.
        self.look_up_existing = False
        self.pod_path = object_path("v1", "Pod", namespace, naming.pod_name(name))
        self.wake = runtime.wakeup(namespace, name)
        # The Session and its ancestors as the last pass read them, for the freeze check.
        self.chain: list[dict[str, Any]] = []
        # The address of the pod a resumed Session's conversation was restored into.
        self.restored_into: str | None = None
        # Work a pass started and does not wait for (archiving the log): kept referenced.
        self._background: set[asyncio.Task[None]] = set()

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` beside the loop; its task is kept until it ends."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @property
    def pod_name(self) -> str:
        return self.pod_path.rpartition("/")[2]

    async def read_through(
        self, seen: WatchedObjects, name: str, path: str, *, ask: bool = True
    ) -> dict[str, Any] | None:
        """The object as recently watched, else (unless not `ask`ed to) read from the server
        and remembered: an Agent that does not change is then read once per
        WATCHED_FRESH_SECONDS, not once per pass of each of its Sessions."""
        found = seen.get(self.namespace, name)
        if found is None and ask:
            seen.saw(self.namespace, name, await self.kube.get(path))
            found = seen.get(self.namespace, name)  # as kept: the same shape either way
        return found

    async def read_agent(self, agent_ref: str, *, fresh: bool = False) -> dict[str, Any] | None:
        """The Agent as watched; `fresh` reads it from the API server, for a pass that makes a
        pod from it: an Agent patched just before its Session was applied may not have reached
        the watch yet, and a pod made from the older Agent would keep its credentials."""
        path = corral_path("Agent", self.namespace, agent_ref)
        if fresh:
            self.rt.agents.saw(self.namespace, agent_ref, await self.kube.get(path))
            return self.rt.agents.get(self.namespace, agent_ref)
        return await self.read_through(self.rt.agents, agent_ref, path)

    async def read_pod(self, *, ask: bool = True) -> dict[str, Any] | None:
        return await self.read_through(self.rt.pods, self.pod_name, self.pod_path, ask=ask)

    async def own_children(self, uid: str) -> list[dict[str, Any]]:
        """The Sessions the custodian started for this one (labelled with its uid)."""
        return await self.kube.list(
            corral_path("Session", self.namespace), label_selector=f"{PARENT_UID_LABEL}={uid}"
        )

    async def frozen_by(self) -> FrozenBy | None:
        """The Freeze that holds this Session now, from the namespace's Freeze cache (its first
        read lists them from the API server, so a freeze is not missed at start-up)."""
        freezes = await self.rt.freezes.freezes(self.kube, self.namespace)
        return covering_freeze(self.chain, freezes)
