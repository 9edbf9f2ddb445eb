"""What the console reads: Corral's kinds through one API client, and a Session's live turn
through its harness's wire.

In the operator's Deployment the client is the console's own identity (read-only use of the
operator's rights; every request was authorised for the person first); under `corral console`
it is the person's kubeconfig, so the API server itself decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from .. import naming
from ..kube import Kube, KubeError, corral_path, object_path
from ..sessionloop import read_wire_token
from ..wireclient import ConversationLost, WireClient, WireFault

Obj = dict[str, Any]

# The console's plural for each kind it shows.
PLURALS = {"Session": "sessions", "Goal": "goals", "Evidence": "evidences", "Approval": "approvals"}


class StreamUnavailable(Exception):
    """The live turn cannot be read: no pod, no address, no wire token, or the harness is gone."""


@dataclass
class Reader:
    kube: Kube
    harness_port: int = 8080
    # The namespaces to show; None: every namespace (a cluster-wide list).
    namespaces: tuple[str, ...] | None = None

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
            except KubeError as err:
                if err.status not in (401, 403):
                    raise
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
            raise StreamUnavailable(f"the sandbox pod cannot be read: {err.reason}") from None
        ip = ((pod or {}).get("status") or {}).get("podIP")
        if not ip:
            raise StreamUnavailable("the sandbox pod is gone or has no address yet")
        try:
            token = await read_wire_token(
                self.kube, md["namespace"], md["name"], str(md.get("uid", ""))
            )
        except KubeError as err:
            raise StreamUnavailable(f"the wire token cannot be read: {err.reason}") from None
        agent = str((session.get("spec") or {}).get("agentRef", ""))
        return WireClient(f"http://{ip}:{self.harness_port}", agent, token=token)

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
