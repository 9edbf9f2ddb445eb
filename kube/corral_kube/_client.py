"""JSON over httpx to the API server: requests by path, lists, and watches as streamed lines.
Every failure is raised as one of `_errors`' tree, never as httpx's own."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from datetime import datetime
from typing import Any

import httpx

from ._config import ExecPlugin, KubeConfig
from ._errors import KubeConfigError, KubeRefused, KubeUnreachable, NotFound, refused

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
Query = Mapping[str, str] | list[tuple[str, str]]


class _Bearer(httpx.Auth):
    """The config's token on every request: a token file re-read each time (each new value
    passed to `on_token` before it is sent), an exec plugin's token until it expires."""

    def __init__(self, config: KubeConfig) -> None:
        self._config = config
        self._announced: str | None = None
        self._exec_token: str | None = None
        self._exec_until = 0.0
        self._exec_runs = asyncio.Lock()  # one run of the plugin for requests that wait on it

    async def token(self) -> str | None:
        config = self._config
        if config.token:
            return self._announce(config.token)
        if config.token_file is not None:
            try:
                text = config.token_file.read_text().strip()
            except OSError as e:
                raise KubeConfigError(f"the token {config.token_file} cannot be read: {e}") from e
            return self._announce(text)
        if config.exec_plugin is not None:
            async with self._exec_runs:
                if self._exec_token is None or time.time() >= self._exec_until:
                    self._exec_token, self._exec_until = await _run_exec(config.exec_plugin)
                return self._announce(self._exec_token)
        return None

    def _announce(self, token: str) -> str:
        if token != self._announced and self._config.on_token is not None:
            try:
                self._config.on_token(token)
            except ValueError as e:  # not sent: the holder refused it
                raise KubeConfigError(f"the token is refused: {e}") from e
        self._announced = token
        return token

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        token = await self.token()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401 and self._config.exec_plugin is not None:
            self._exec_token = None  # revoked before its expiry: the plugin is asked again
            renewed = await self.token()
            if renewed and renewed != token:
                request.headers["Authorization"] = f"Bearer {renewed}"
                yield request


async def _run_exec(plugin: ExecPlugin) -> tuple[str, float]:
    """The plugin's token and when to ask again (never, when it gives no expiry)."""
    info: dict[str, Any] = {"apiVersion": plugin.api_version, "kind": "ExecCredential"}
    info["spec"] = {"interactive": False}
    env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
    try:
        process = await asyncio.create_subprocess_exec(
            plugin.command, *plugin.args, env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await process.communicate()
    except OSError as e:
        raise KubeConfigError(f"the exec plugin {plugin.command} cannot run: {e}") from e
    if process.returncode != 0:
        raise KubeConfigError(f"the exec plugin {plugin.command} exited {process.returncode}")
    try:
        status = json.loads(out).get("status") or {}
    except (ValueError, AttributeError) as e:
        raise KubeConfigError(f"the exec plugin {plugin.command} printed no ExecCredential") from e
    if not status.get("token"):  # a client certificate from a plugin is not supported
        raise KubeConfigError(f"the exec plugin {plugin.command} gave no token")
    expiry = status.get("expirationTimestamp")
    try:
        until = datetime.fromisoformat(str(expiry)).timestamp() - 10 if expiry else float("inf")
    except ValueError as e:
        raise KubeConfigError(f"the exec plugin {plugin.command} gave a bad expiry: {e}") from e
    return str(status["token"]), until


def _params(query: Query | None) -> list[tuple[str, Any]] | None:
    if query is None:
        return None
    return list(query.items()) if isinstance(query, Mapping) else list(query)


def _refusal(response: httpx.Response) -> KubeRefused:
    """The error status as its refusal, with the Status object's message and reason."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        message = str(body.get("message") or response.reason_phrase)
        return refused(response.status_code, message, str(body.get("reason") or ""))
    return refused(response.status_code, response.text.strip() or response.reason_phrase)


def _unreachable(e: httpx.HTTPError) -> KubeUnreachable:
    return KubeUnreachable(f"the API server is unreachable: {type(e).__name__}: {e}")


class KubeClient:
    """One connection pool to one API server. `timeout` None waits as long as the server
    takes (it ends a request itself at its --request-timeout)."""

    def __init__(
        self,
        config: KubeConfig,
        *,
        timeout: float | None = None,
        max_connections: int = 100,
        user_agent: str = "corral",
    ) -> None:
        self.config = config
        self._auth = _Bearer(config)
        self._timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=config.server,
            verify=config.ssl_context(),
            auth=self._auth,
            timeout=timeout,
            headers={"Accept": JSON, "User-Agent": user_agent},
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def bearer_token(self) -> str | None:
        """The token this client presents (None: a client certificate, or anonymous)."""
        return await self._auth.token()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Query | None = None,
        content_type: str = JSON,
        answer: bool = True,
    ) -> Any:
        """One call: the answer as JSON (as text when it is not JSON, None when empty), or
        not read at all when not `answer`."""
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if content is not None else None
        params = _params(query)
        try:
            response = await self._http.request(
                method, path, content=content, params=params, headers=headers
            )
        except httpx.HTTPError as e:
            raise _unreachable(e) from e
        if response.status_code >= 400:
            raise _refusal(response)
        if not answer or not response.content:
            return None
        try:
            return json.loads(response.content)
        except ValueError:
            return response.text  # a pod's log

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object at `path`; None when there is none."""
        try:
            found = await self.request("GET", path)
        except NotFound:
            return None
        return found if isinstance(found, dict) else None

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        found = await self.request("GET", path, query=query)
        return list(found.get("items") or []) if isinstance(found, dict) else []

    async def watch(
        self,
        path: str,
        resource_version: str,
        *,
        timeout_seconds: int = 240,
        label_selector: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """The watch events after `resource_version` (bookmarks included) until the server
        ends the watch; `Gone` when that version has expired."""
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if label_selector:
            query["labelSelector"] = label_selector
        timeout = httpx.Timeout(self._timeout, read=timeout_seconds + 30.0)
        try:
            async with self._http.stream("GET", path, params=query, timeout=timeout) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise _refusal(response)
                async for line in response.aiter_lines():
                    if line.strip():
                        yield _event(line)
        except httpx.HTTPError as e:
            raise _unreachable(e) from e


def _event(line: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError as e:
        raise KubeUnreachable(f"the watch stream broke: {e}") from e
    if not isinstance(event, dict):
        raise KubeUnreachable("the watch stream sent a line that is not an event")
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        code = int(status.get("code") or 500)
        raise refused(code, str(status.get("message") or ""), str(status.get("reason") or ""))
    return event


