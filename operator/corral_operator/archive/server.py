"""The archive reader: people read a Session's transcript and receipts here, live or archived.

A request carries the person's own bearer token: in `Authorization` when called directly, in
`X-Corral-Authorization` through the API server's service proxy (which drops the caller's
`Authorization` once it has authenticated them). The reader asks the API server, with that
token, whether its holder may `get` the Session (a SelfSubjectAccessReview): Kubernetes RBAC
decides, the reader holds no list of people and never widens what a token may do. Only then
does it answer, from the live harness while the sandbox serves (the operator is the one
client the sandbox's NetworkPolicy and wire token admit) and from the archive once it is gone,
at the same offsets (docs/history.md, docs/decisions ADR "people read the wire through the
operator"). Both reads have the operator's cap (`--max-history-bytes`): past it the answer is
502 `history_too_large` or `archive_too_large`, naming the cap, and nothing is held in memory.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from aiohttp import web

from corral_api.kinds import FINAL_PHASES
from corral_api.wire import READER_AUTHORIZATION_HEADER
from corral_kube import KubeError

from ..driver import AnswerTooLarge, ConversationLost, WireFault
from ..kube import Kube, corral_path, object_path
from ..wireclient import DEFAULT_MAX_ANSWER_BYTES, WireClient
from .record import ArchivedSession
from .store import ArchiveStore, ArchiveTooLarge

log = logging.getLogger("corral.operator.archive")

MAX_WAIT_SECONDS = 20.0
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def _error(status: int, error: str, reason: str) -> web.Response:
    return web.json_response({"error": error, "reason": reason}, status=status)


class Reader:
    def __init__(
        self,
        kube: Kube,
        store: ArchiveStore | None,
        *,
        harness_port: int,
        read_token: Callable[[str, str, str], Awaitable[str]],
        transport: httpx.AsyncBaseTransport | None = None,
        max_history_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        self.kube = kube
        self.store = store
        self.harness_port = harness_port
        self.read_token = read_token  # (namespace, name, uid) -> the Session's wire token
        self.transport = transport
        # The most read of one live page (the archive's own objects carry the store's cap).
        self.max_history_bytes = max_history_bytes
        # The person's token goes to the API server alone, with the cluster's CA and never
        # the operator's own client certificate (which would authenticate as the operator).
        tls = kube.config.ssl_context(client_cert=False)
        self._api = httpx.AsyncClient(base_url=kube.config.server, verify=tls, timeout=10.0)

    async def aclose(self) -> None:
        await self._api.aclose()

    # ---------------------------------------------------------------------------- access

    async def allowed(self, token: str, namespace: str, name: str) -> web.Response | None:
        """None when the token's holder may get this Session; else the answer to give."""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": "get",
                    "group": "corral.dev",
                    "resource": "sessions",
                    "name": name,
                }
            },
        }
        answer = await self._api.post(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            json=review,
            headers={"Authorization": f"Bearer {token}"},
        )
        if answer.status_code == 401:
            return _error(401, "unauthorized", "the API server did not accept this token")
        if answer.status_code >= 300:
            return _error(502, "review_failed", f"access review: HTTP {answer.status_code}")
        status = answer.json().get("status") or {}
        if not status.get("allowed"):
            why = status.get("reason") or "RBAC does not allow it"
            return _error(
                403, "forbidden", f"you may not get sessions/{name} in {namespace}: {why}"
            )
        return None

    # ---------------------------------------------------------------------------- reads

    async def transcript(
        self, namespace: str, name: str, offset: int, wait: float
    ) -> dict[str, Any] | None:
        """Events after `offset`: from the harness while it serves, else from the archive."""
        session = await self.kube.get(corral_path("Session", namespace, name))
        status = (session or {}).get("status") or {}
        phase = status.get("phase")
        live = await self._live(session, offset, wait) if session is not None else None
        if live is not None:
            return {**live, "source": "live", "phase": phase, "final": phase in FINAL_PHASES}
        uid = (session or {}).get("metadata", {}).get("uid")
        archived = await self._archived(namespace, name, uid)
        if archived is None:
            if session is None:
                return None
            # Not started yet, or between its pod's end and its archive: nothing to show yet.
            return {"events": [], "offset": offset, "source": "none", "phase": phase,
                    "final": False}  # fmt: skip
        events = archived.events_from(offset)
        return {
            "events": events,
            "offset": offset + len(events),
            "source": "archive",
            "phase": archived.record["session"]["status"].get("phase"),
            "final": True,
        }

    async def _live(
        self, session: dict[str, Any], offset: int, wait: float
    ) -> dict[str, Any] | None:
        md = session["metadata"]
        pod_name = (session.get("status") or {}).get("podName")
        if not pod_name:
            return None
        pod = await self.kube.get(object_path("v1", "Pod", md["namespace"], str(pod_name)))
        ip = ((pod or {}).get("status") or {}).get("podIP")
        if pod is None or not ip or pod["metadata"].get("deletionTimestamp"):
            return None
        try:
            token = await self.read_token(md["namespace"], md["name"], md.get("uid", ""))
            agent = str(session["spec"].get("agentRef", ""))
            url = f"http://{ip}:{self.harness_port}"
            async with WireClient(
                url,
                agent,
                token=token,
                transport=self.transport,
                max_answer_bytes=self.max_history_bytes,
            ) as client:
                page = await client.updates(md["name"], offset, min(wait, MAX_WAIT_SECONDS))
        except ConversationLost:
            return {"events": [], "offset": offset}
        except AnswerTooLarge:
            raise  # the harness serves, but more than may be read: the person is told so
        except (KubeError, WireFault, httpx.HTTPError, OSError) as err:
            # The pod is going: the archive (or nothing yet) answers instead.
            log.info("live transcript of %s/%s unavailable: %s", md["namespace"], md["name"], err)
            return None
        return {"events": page.events, "offset": page.offset}

    async def _archived(self, namespace: str, name: str, uid: str | None) -> ArchivedSession | None:
        if self.store is None:
            return None
        return await asyncio.to_thread(self.store.read, namespace, name, uid)

    async def record(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.store is None:
            return None
        session = await self.kube.get(corral_path("Session", namespace, name))
        uid = (session or {}).get("metadata", {}).get("uid")
        archived = await self._archived(namespace, name, uid)
        return None if archived is None else dict(archived.record)


def _person_token(request: web.Request) -> str | None:
    """The bearer token to review: Corral's own header when sent (the API server's service
    proxy drops `Authorization` once it has authenticated the caller), else `Authorization`.
    Either is reviewed the same way; the proxy's own authentication of the caller widens
    nothing."""
    header = str(
        request.headers.get(READER_AUTHORIZATION_HEADER)
        or request.headers.get("Authorization")
        or ""
    )
    if not header.startswith("Bearer ") or not header[7:].strip():
        return None
    return header[7:].strip()


def build_app(reader: Reader) -> web.Application:
    routes = web.RouteTableDef()

    async def guard(request: web.Request) -> tuple[str, str] | web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if not (_NAME.match(namespace) and _NAME.match(name)):
            return _error(400, "bad_name", "namespace and name must be Kubernetes object names")
        token = _person_token(request)
        if token is None:
            return _error(401, "unauthorized", "send your Kubernetes bearer token")
        refused = await reader.allowed(token, namespace, name)
        return refused if refused is not None else (namespace, name)

    base = "/v1/namespaces/{namespace}/sessions/{name}"

    @routes.get(base + "/transcript")
    async def transcript(request: web.Request) -> web.StreamResponse:
        checked = await guard(request)
        if isinstance(checked, web.Response):
            return checked
        try:
            offset = int(request.query.get("offset", "0"))
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            return _error(400, "bad_request", "offset must be an integer and wait a number")
        if offset < 0 or wait < 0:
            return _error(400, "bad_request", "offset and wait must not be negative")
        try:
            found = await reader.transcript(*checked, offset, wait)
        except AnswerTooLarge as err:
            return _error(502, "history_too_large", str(err))
        except ArchiveTooLarge as err:
            return _error(502, "archive_too_large", str(err))
        except OSError as err:
            return _error(503, "archive_unavailable", f"the archive cannot be read: {err}")
        if found is None:
            return _error(404, "not_found", f"no session {checked[1]} and no archive of one")
        return web.json_response(found)

    @routes.get(base + "/record")
    async def record(request: web.Request) -> web.StreamResponse:
        checked = await guard(request)
        if isinstance(checked, web.Response):
            return checked
        try:
            found = await reader.record(*checked)
        except ArchiveTooLarge as err:
            return _error(502, "archive_too_large", str(err))
        except OSError as err:
            return _error(503, "archive_unavailable", f"the archive cannot be read: {err}")
        if found is None:
            return _error(404, "not_archived", f"session {checked[1]} has no archive (yet)")
        return web.json_response(found)

    app = web.Application()
    app.add_routes(routes)
    return app


class RunningReader:
    def __init__(self, runner: web.AppRunner, reader: Reader) -> None:
        self.runner = runner
        self.reader = reader

    async def cleanup(self) -> None:
        await self.runner.cleanup()
        await self.reader.aclose()


async def start_archive_reader(
    kube: Kube,
    store: ArchiveStore | None,
    host: str,
    port: int,
    *,
    harness_port: int,
    read_token: Callable[[str, str, str], Awaitable[str]],
    transport: httpx.AsyncBaseTransport | None = None,
    max_history_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> RunningReader:
    """Serve the reader for this operator's Sessions at host:port; `read_token` reads a
    Session's wire token (namespace, name, uid) as the Session's loop does."""
    reader = Reader(
        kube,
        store,
        harness_port=harness_port,
        read_token=read_token,
        transport=transport,
        max_history_bytes=max_history_bytes,
    )
    runner = web.AppRunner(build_app(reader), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("archive reader listening on %s:%d", host, port)
    return RunningReader(runner, reader)
