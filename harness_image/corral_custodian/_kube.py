"""Plain httpx access to the Kubernetes API with the pod's projected service-account token.

The token is read from its file on every request, because the kubelet rotates projected tokens;
each new value is registered with the redactor before it is used.
"""

from __future__ import annotations

import ssl
from typing import Any

import httpx

from . import _secrets
from .settings import SERVICE_ACCOUNT_TOKEN, KubeSettings

CORRAL = "/apis/corral.dev/v1alpha1"


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {message}")
        self.status = status
        self.message = message


class KubeClient:
    def __init__(self, settings: KubeSettings) -> None:
        self._settings = settings
        self._registered = ""  # the token last registered with the redactor
        verify: ssl.SSLContext | bool = True
        if settings.ca_file is not None:
            verify = ssl.create_default_context(cafile=str(settings.ca_file))
        self._http = httpx.AsyncClient(base_url=settings.api, verify=verify, timeout=15.0)

    async def aclose(self) -> None:
        await self._http.aclose()

    def _headers(self) -> dict[str, str]:
        token = self._settings.token_file.read_text().strip()
        if token != self._registered:
            try:
                _secrets.register(SERVICE_ACCOUNT_TOKEN, token)
            except _secrets.SecretTooShort as e:
                raise OSError(str(e)) from None  # not sent: it could not be redacted
            self._registered = token
        return {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            headers = self._headers()
        except OSError as e:
            raise KubeError(503, f"the service-account token cannot be read: {e}") from e
        try:
            return await self._http.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as e:
            raise KubeError(503, f"the API server is unreachable: {e}") from e

    @staticmethod
    def _fail(response: httpx.Response) -> KubeError:
        try:
            message = str(response.json().get("message", response.text))
        except ValueError:
            message = response.text
        return KubeError(response.status_code, message)

    async def get(self, path: str) -> dict[str, Any] | None:
        response = await self._send("GET", path)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._fail(response)
        body: dict[str, Any] = response.json()
        return body

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        response = await self._send("GET", path, params=params)
        if response.status_code != 200:
            raise self._fail(response)
        items: list[dict[str, Any]] = response.json().get("items", [])
        return items

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self._send("POST", path, json=body)
        if response.status_code not in (200, 201):
            raise self._fail(response)
        created: dict[str, Any] = response.json()
        return created


def corral_path(namespace: str, plural: str, name: str | None = None) -> str:
    base = f"{CORRAL}/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base
