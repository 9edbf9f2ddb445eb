"""What the console reads: Corral's kinds through one API client, and a Session's live turn
through its harness's wire.

In the operator's Deployment the client is the console's own identity (read-only use of the
operator's rights; every request was authorised for the person first); under `corral console`
it is the person's kubeconfig, so the API server itself decides.
"""

from __future__ import annotations

import asyncio
import base64
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from corral_kube import Forbidden, KubeError, Unauthorized

from .. import naming
from ..archive.record import ArchivedSession
from ..archive.store import ArchiveStore
from ..builders.podbuilder import WIRE_TOKEN_KEY
from ..kube import Kube, corral_path, object_path
from ..planning.session import ownership
from ..wireclient import DEFAULT_MAX_ANSWER_BYTES, ConversationLost, WireClient, WireFault
from .changes import RemoteChanges

Obj = dict[str, Any]

# The console's plural for each kind it shows.
PLURALS = {"Session": "sessions", "Goal": "goals", "Evidence": "evidences", "Approval": "approvals"}


class StreamUnavailable(Exception):
    """The live turn cannot be read: no pod, no address, no wire token, or the harness is gone."""


class Source(Protocol):
    """What the console reads from: a cluster (`Reader`) or a `corral run` state directory
    (the CLI's `LocalSource`, docs/console.md)."""

    namespaces: tuple[str, ...] | None

    async def objects(self, kind: str, namespace: str) -> list[Obj]: ...

    async def list_everywhere(self, kind: str) -> dict[str, list[Obj]]: ...

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None: ...

    async def wire(self, session: Obj) -> Any: ...

    async def updates(
        self, client: Any, conversation: str, offset: int, wait: float
    ) -> tuple[list[Obj], int]: ...

    async def archived(
        self, namespace: str, name: str, uid: str | None
    ) -> ArchivedSession | None: ...

    async def changes(self, session: Obj) -> Obj | None:
        """What the Session delivered, turn by turn (`changes.read_changes`, or
        `{"unavailable": why}`); None when this source reads no changes."""
        ...


def default_changes_cache() -> Path:
    """The console's git cache in the operator's Deployment: its /tmp volume."""
    return Path(tempfile.gettempdir()) / "corral-console-git"


@dataclass
class Reader:
    kube: Kube
    harness_port: int = 8080
    # The namespaces to show; None: every namespace (a cluster-wide list).
    namespaces: tuple[str, ...] | None = None
    # Where finished Sessions are archived (docs/history.md): what the console shows once a
    # sandbox pod, or the Session itself, is gone. None: no archive configured.
    archive: ArchiveStore | None = None
    # The most read of one live page (the operator's --max-history-bytes; the archive's store
    # has its own cap).
    max_history_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    # Where delivered work is read from (the Session's remote, into this cache; never the pod).
    remote_changes: RemoteChanges = field(
        default_factory=lambda: RemoteChanges(default_changes_cache())
    )

    async def changes(self, session: Obj) -> Obj | None:
        return await asyncio.to_thread(self.remote_changes.read, session)

    async def archived(self, namespace: str, name: str, uid: str | None) -> ArchivedSession | None:
        """The Session's archive: the same store and reading as the archive reader's (`corral
        logs`, `corral describe`), so both show one record. None without an archive."""
        if self.archive is None:
            return None
        return await asyncio.to_thread(self.archive.read, namespace, name, uid)

    async def objects(self, kind: str, namespace: str) -> list[Obj]:
        return await self.kube.list(corral_path(kind, namespace))

    async def list_everywhere(self, kind: str) -> dict[str, list[Obj]]:
        """Objects by namespace, over the configured namespaces (or a cluster-wide list)."""
        found: dict[str, list[Obj]] = {}
        if self.namespaces is None:
            items = await self.kube.list(f"/apis/corral.dev/v1alpha1/{PLURALS[kind]}")
            for item in items:
                found.setdefault(item["metadata"].get("namespace", ""), []).append(item)
            return found
        for namespace in self.namespaces:
            try:
                found[namespace] = await self.objects(kind, namespace)
            except (Unauthorized, Forbidden):
                continue  # a namespace this identity may not read
        return found

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        return await self.kube.get(corral_path(kind, namespace, name))

    async def wire(self, session: Obj) -> WireClient:
        """A wire client to the Session's harness, with its own wire token."""
        md, st = session["metadata"], session.get("status") or {}
        pod_name = st.get("podName") or naming.pod_name(md["name"])
        try:
            pod = await self.kube.get(object_path("v1", "Pod", md["namespace"], pod_name))
        except KubeError as err:
            raise StreamUnavailable(f"the sandbox pod cannot be read: {err.message}") from None
        ip = ((pod or {}).get("status") or {}).get("podIP")
        if not ip:
            raise StreamUnavailable("the sandbox pod is gone or has no address yet")
        # The Session's own Secret only, as the operator's loop reads it (session.wiretoken),
        # each failure told as the console's own answer.
        path = object_path("v1", "Secret", md["namespace"], naming.wire_secret_name(md["name"]))
        try:
            secret = await self.kube.get(path)
        except KubeError as err:
            raise StreamUnavailable(f"the wire token cannot be read: {err.message}") from None
        if secret is None or ownership(secret, md["name"], str(md.get("uid", ""))) != "ours":
            raise StreamUnavailable("the sandbox's wire-token Secret is missing or not its own")
        token = base64.b64decode(secret["data"][WIRE_TOKEN_KEY]).decode()
        agent = str((session.get("spec") or {}).get("agentRef", ""))
        return WireClient(
            f"http://{ip}:{self.harness_port}",
            agent,
            token=token,
            max_answer_bytes=self.max_history_bytes,
        )

    @staticmethod
    async def updates(
        client: WireClient, conversation: str, offset: int, wait: float
    ) -> tuple[list[Obj], int]:
        try:
            page = await client.updates(conversation, offset=offset, wait=wait)
        except ConversationLost:
            raise StreamUnavailable("the harness has no record of this session") from None
        except (WireFault, httpx.HTTPError) as err:
            raise StreamUnavailable(f"the harness did not answer: {err}") from None
        return list(page.events), page.offset
