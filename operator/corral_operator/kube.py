"""The operator's one way to the API server: corral_kube's client, with the paths of the kinds
it writes and a bound on its writes in flight.

Objects travel as plain dicts (the planners and the pod builder speak dicts), so this adapter
maps a manifest's apiVersion/kind to its REST path and nothing more.

Creates and reads go out at once; updates and deletes (status writes, a released pod) take one
of `WRITES_IN_FLIGHT` slots. A busy API server shares its CPU among the requests in flight:
in a 1,000-Session burst the status writes and deletes of Sessions already running (up to 94
at once) took most of it from the creates that give a waiting Session its sandbox. Bounded,
they wait here instead, cheaply, and a new Session's Secret and pod go first (ADR 0091).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from corral_api import corral_path as api_corral_path
from corral_kube import (
    MERGE_PATCH,
    Conflict,
    KubeClient,
    KubeConfig,
    KubeConfigError,
    NotFound,
    Query,
    in_cluster,
    in_cluster_available,
    load_kubeconfig,
)

# Updates and deletes in flight at once by default (`--api-writes-in-flight`; creates and reads
# are not held). On two cores, 6 kept a burst's status writes flowing (three a Session) while
# creates went first; 4 starved them, 12 let them crowd the creates (docs/performance.md).
WRITES_IN_FLIGHT = 6
_HELD_METHODS = frozenset({"PATCH", "PUT", "DELETE"})
# Many Sessions poll and patch at once; a pool of 100 was the bottleneck.
_CONNECTIONS = 256

_PLURALS = {
    "Pod": "pods",
    "Secret": "secrets",
    "Event": "events",
    "NetworkPolicy": "networkpolicies",
    "Service": "services",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "Agent": "agents",
    "Session": "sessions",
    "Goal": "goals",
    "Evidence": "evidences",
    "Approval": "approvals",
    "Freeze": "freezes",
}


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    plural = _PLURALS[kind]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{plural}"


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(api_version, kind, namespace)}/{name}"


def corral_path(kind: str, namespace: str, name: str | None = None) -> str:
    return api_corral_path(namespace, _PLURALS[kind], name)


@dataclass
class Kube:
    client: KubeClient
    writes: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(WRITES_IN_FLIGHT))
    # Updates and deletes waiting for a slot, and holding one (the operator's metrics).
    writes_waiting: int = 0
    writes_sending: int = 0

    @classmethod
    async def connect(
        cls, kubeconfig: str | None = None, *, writes_in_flight: int = WRITES_IN_FLIGHT
    ) -> Kube:
        """`kubeconfig`; without one the pod's service account, else the default kubeconfig."""
        if kubeconfig is None and in_cluster_available():
            try:
                return cls.of(in_cluster(), writes_in_flight=writes_in_flight)
            except KubeConfigError:
                pass
        return cls.of(load_kubeconfig(kubeconfig), writes_in_flight=writes_in_flight)

    @classmethod
    def of(cls, config: KubeConfig, *, writes_in_flight: int = WRITES_IN_FLIGHT) -> Kube:
        # No client timeout (the operator never had one): the API server ends a request at its
        # own --request-timeout (60 s), and in a burst a slow answer is not a failed one.
        client = KubeClient(config, timeout=None, max_connections=_CONNECTIONS)
        return cls(client, asyncio.Semaphore(writes_in_flight))

    @property
    def config(self) -> KubeConfig:
        return self.client.config

    async def close(self) -> None:
        await self.client.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Query | None = None,
        content_type: str = "application/json",
        answer: bool = True,
    ) -> Any:
        """One call; the answer parsed as JSON, or not parsed at all when not `answer` (a
        created pod's answer is some 10 kB the caller never reads)."""
        options = {"body": body, "query": query, "content_type": content_type, "answer": answer}
        if method not in _HELD_METHODS:
            return await self.client.request(method, path, **options)
        self.writes_waiting += 1
        try:
            await self.writes.acquire()
        finally:
            self.writes_waiting -= 1
        self.writes_sending += 1
        try:
            return await self.client.request(method, path, **options)
        finally:
            self.writes_sending -= 1
            self.writes.release()

    def write_slots(self) -> tuple[int, int]:
        """(waiting, sending): updates and deletes waiting for a slot, and holding one."""
        return self.writes_waiting, self.writes_sending

    async def get(self, path: str) -> dict[str, Any] | None:
        return await self.client.get(path)

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        return await self.client.list(path, label_selector)

    async def create(self, manifest: dict[str, Any]) -> bool:
        """Create `manifest`; False when it exists already (a restart re-creating it)."""
        return await self._create(manifest, answer=False) is not None

    async def create_object(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Create `manifest` and return the object as created; None when it exists already."""
        return await self._create(manifest, answer=True)

    async def _create(self, manifest: dict[str, Any], *, answer: bool) -> dict[str, Any] | None:
        md = manifest["metadata"]
        path = collection_path(manifest["apiVersion"], manifest["kind"], md["namespace"])
        try:
            created = await self.request("POST", path, body=manifest, answer=answer)
        except Conflict:
            return None
        return dict(created) if isinstance(created, dict) else {}

    async def delete(self, path: str, *, propagation: str = "Background") -> bool:
        """Delete; False when it was gone already."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        try:
            await self.request("DELETE", path, body=body, answer=False)
        except NotFound:
            return False
        return True

    async def patch_status(self, path: str, status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status subresource. Keys set to None are removed by the server."""
        patched = await self.request(
            "PATCH", f"{path}/status", body={"status": status}, content_type=MERGE_PATCH
        )
        return dict(patched) if isinstance(patched, dict) else {}
