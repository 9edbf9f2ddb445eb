"""A small async Kubernetes client for the local node: kubeconfig in, JSON out (httpx)."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import yaml


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class Gone(KubeError):
    """The watch's resourceVersion expired: list again."""


def _material(entry: dict[str, Any], key: str, scratch: Path, name: str, base: Path) -> Path | None:
    """A kubeconfig file reference (`key`) or inline data (`key-data`) as a file path."""
    if entry.get(f"{key}-data"):
        scratch.mkdir(parents=True, exist_ok=True)
        target = scratch / name
        target.write_bytes(base64.b64decode(entry[f"{key}-data"]))
        target.chmod(0o600)
        return target
    if entry.get(key):
        path = Path(entry[key])
        return path if path.is_absolute() else base / path
    return None


class NodeKube:
    def __init__(self, kubeconfig: Path, scratch: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        current = config.get("current-context")
        contexts = {c["name"]: c["context"] for c in config.get("contexts", [])}
        context = contexts[current] if current else next(iter(contexts.values()))
        cluster = {c["name"]: c["cluster"] for c in config["clusters"]}[context["cluster"]]
        user = {u["name"]: u["user"] for u in config["users"]}[context["user"]]
        base = kubeconfig.parent
        self.server = str(cluster["server"]).rstrip("/")
        ca = _material(cluster, "certificate-authority", scratch, "ca.crt", base)
        context_ssl = ssl.create_default_context(cafile=str(ca) if ca else None)
        cert = _material(user, "client-certificate", scratch, "client.crt", base)
        key = _material(user, "client-key", scratch, "client.key", base)
        if cert and key:
            context_ssl.load_cert_chain(str(cert), str(key))
        headers = {"Accept": "application/json"}
        if user.get("token"):
            headers["Authorization"] = f"Bearer {user['token']}"
        self.ca_file = ca
        self._http = httpx.AsyncClient(
            base_url=self.server,
            verify=context_ssl,
            headers=headers,
            timeout=httpx.Timeout(30.0),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    @staticmethod
    def _error(response: httpx.Response) -> KubeError:
        try:
            message = str(response.json().get("message", response.text))
        except ValueError:
            message = response.text
        if response.status_code == 410:
            return Gone(410, message)
        return KubeError(response.status_code, message)

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (200, 201),
    ) -> dict[str, Any]:
        content = None if body is None else json.dumps(body).encode()
        try:
            response = await self._http.request(
                method, path, content=content, params=params, headers={"Content-Type": content_type}
            )
        except httpx.HTTPError as e:
            # One error type for callers: the API server could not be reached.
            raise KubeError(503, f"the API server is unreachable: {e}") from e
        if response.status_code not in ok:
            raise self._error(response)
        if not response.content:
            return {}
        result: dict[str, Any] = response.json()
        return result

    async def get(self, path: str) -> dict[str, Any]:
        return await self.request("GET", path)

    async def watch(
        self, path: str, resource_version: str, timeout_seconds: int = 240
    ) -> AsyncIterator[dict[str, Any]]:
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        timeout = httpx.Timeout(30.0, read=timeout_seconds + 30.0)
        async with self._http.stream("GET", path, params=params, timeout=timeout) as response:
            if response.status_code != 200:
                await response.aread()
                raise self._error(response)
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event: dict[str, Any] = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    code = int(status.get("code") or 500)
                    if code == 410:
                        raise Gone(410, str(status.get("message")))
                    raise KubeError(code, str(status.get("message")))
                yield event
