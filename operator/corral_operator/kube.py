"""The operator's one way to the API server: raw JSON over kubernetes_asyncio's ApiClient.

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
import json
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from corral_api import GROUP, VERSION

MERGE_PATCH = "application/merge-patch+json"

# Updates and deletes in flight at once by default (`--api-writes-in-flight`; creates and reads
# are not held). On two cores, 6 kept a burst's status writes flowing (three a Session) while
# creates went first; 4 starved them, 12 let them crowd the creates (docs/performance.md).
WRITES_IN_FLIGHT = 6
_HELD_METHODS = frozenset({"PATCH", "PUT", "DELETE"})

_PLURALS = {
    "Pod": "pods",
    "Secret": "secrets",
    "Event": "events",
    "NetworkPolicy": "networkpolicies",
    "Agent": "agents",
    "Session": "sessions",
    "Goal": "goals",
    "Evidence": "evidences",
    "Approval": "approvals",
    "Freeze": "freezes",
}


class KubeError(Exception):
    """The API server refused a call; `status` and `reason` say how."""

    def __init__(self, status: int, reason: str) -> None:
        self.status = status
        self.reason = reason
        super().__init__(f"{status}: {reason}")


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    plural = _PLURALS[kind]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{plural}"


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(api_version, kind, namespace)}/{name}"


def corral_path(kind: str, namespace: str, name: str | None = None) -> str:
    api = f"{GROUP}/{VERSION}"
    if name is None:
        return collection_path(api, kind, namespace)
    return object_path(api, kind, namespace, name)


def _reason(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or b"{}").get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


@dataclass
class Kube:
    api: client.ApiClient
    writes: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(WRITES_IN_FLIGHT))
    # Updates and deletes waiting for a slot, and holding one (the operator's metrics).
    writes_waiting: int = 0
    writes_sending: int = 0

    @classmethod
    async def connect(
        cls, kubeconfig: str | None = None, *, writes_in_flight: int = WRITES_IN_FLIGHT
    ) -> Kube:
        configuration = client.Configuration()
        if kubeconfig is None:
            try:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except config.ConfigException:
                await config.load_kube_config(client_configuration=configuration)
        else:
            await config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration
            )
        # Many sessions poll and patch at once; the default pool of 100 is the bottleneck.
        configuration.connection_pool_maxsize = 256
        return cls(client.ApiClient(configuration), asyncio.Semaphore(writes_in_flight))

    async def close(self) -> None:
        await self.api.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        answer: bool = True,
    ) -> Any:
        """One call; the answer parsed as JSON, or not parsed at all when not `answer` (a
        created pod's answer is some 10 kB the caller never reads)."""
        types = {200: "object", 201: "object", 202: "object"} if answer else {}
        if method not in _HELD_METHODS:
            return await self._call(method, path, body, query, content_type, types)
        self.writes_waiting += 1
        try:
            await self.writes.acquire()
        finally:
            self.writes_waiting -= 1
        self.writes_sending += 1
        try:
            return await self._call(method, path, body, query, content_type, types)
        finally:
            self.writes_sending -= 1
            self.writes.release()

    def write_slots(self) -> tuple[int, int]:
        """(waiting, sending): updates and deletes waiting for a slot, and holding one."""
        return self.writes_waiting, self.writes_sending

    async def _call(
        self,
        method: str,
        path: str,
        body: Any,
        query: list[tuple[str, str]] | None,
        content_type: str,
        types: dict[int, str],
    ) -> Any:
        try:
            result = await self.api.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                response_types_map=types,
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), _reason(exc)) from None
        return result

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            found = await self.request("GET", path)
        except KubeError as err:
            if err.status == 404:
                return None
            raise
        return dict(found) if isinstance(found, dict) else None

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        query = [("labelSelector", label_selector)] if label_selector else []
        found = await self.request("GET", path, query=query)
        return list(found.get("items") or []) if isinstance(found, dict) else []

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
        except KubeError as err:
            if err.status == 409:
                return None
            raise
        return dict(created) if isinstance(created, dict) else {}

    async def delete(self, path: str, *, propagation: str = "Background") -> bool:
        """Delete; False when it was gone already."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        try:
            await self.request("DELETE", path, body=body, answer=False)
        except KubeError as err:
            if err.status == 404:
                return False
            raise
        return True

    async def patch_status(self, path: str, status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status subresource. Keys set to None are removed by the server."""
        patched = await self.request(
            "PATCH", f"{path}/status", body={"status": status}, content_type=MERGE_PATCH
        )
        return dict(patched) if isinstance(patched, dict) else {}
