"""What `corral describe` and `corral logs` share: the client of the operator's archive
reader (docs/history.md), which serves a Session's transcript and receipts, live while its
sandbox serves and archived after its pod is gone.

By default the reader is reached with the kubeconfig alone, through the API server's service
proxy to its Service (`--archive-service`, default corral-system/corral-archive; RBAC: `get`
on `services/proxy` for that one Service). `--archive-url` (or `$CORRAL_ARCHIVE_URL`) reaches
it directly instead, e.g. through a port-forward. The reader authorises each request by asking
the API server whether the caller's own token may `get` the Session, so the token sent is the
kubeconfig's bearer token (`--token` overrides it); client-certificate kubeconfigs have none to
send. The API server drops the caller's `Authorization` before it forwards, so through the
proxy the token travels in Corral's own header (corral_api.wire.READER_AUTHORIZATION_HEADER).
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from ._errors import CommandError

ARCHIVE_URL_ENV = "CORRAL_ARCHIVE_URL"
ARCHIVE_SERVICE_ENV = "CORRAL_ARCHIVE_SERVICE"
# Where `helm install corral charts/corral --namespace corral-system` puts the reader's Service.
DEFAULT_ARCHIVE_SERVICE = "corral-system/corral-archive"
# The header's name (corral_api.wire.READER_AUTHORIZATION_HEADER), kept here as text so that
# `corral logs --help` and a missing kubeconfig need no import of the API's models.
_PERSON_HEADER = "X-Corral-Authorization"
# The chart's name for the Service's port: the proxy's path must name a named port, and the
# chart's Role grants `services/proxy` on `<service>:archive` exactly.
_READER_PORT_NAME = "archive"
_READER_HINT = (
    f"give the reader's URL with --archive-url or ${ARCHIVE_URL_ENV} (e.g. a port-forward of "
    "svc/corral-archive, docs/cli.md)"
)
_PROXY_HINT = (
    f"check --archive-service (or ${ARCHIVE_SERVICE_ENV}) and the operator's pod, or give "
    "--archive-url (docs/cli.md)"
)
_PROXY_FORBIDDEN_HINT = (
    "ask for the chart's <release>-archive-proxy Role (get services/proxy on the reader's "
    "Service), or give --archive-url (docs/cli.md)"
)


def add_reader_options(p: Any) -> None:
    p.add_argument(
        "--archive-url",
        default=os.environ.get(ARCHIVE_URL_ENV),
        help=f"the operator's archive reader (default ${ARCHIVE_URL_ENV})",
    )
    p.add_argument(
        "--archive-service",
        default=os.environ.get(ARCHIVE_SERVICE_ENV) or DEFAULT_ARCHIVE_SERVICE,
        metavar="NAMESPACE/NAME",
        help="the reader's Service, reached through the API server when no --archive-url is "
        f"given (default ${ARCHIVE_SERVICE_ENV}, else {DEFAULT_ARCHIVE_SERVICE})",
    )
    p.add_argument("--token", help="bearer token to present (default: the kubeconfig's)")


class ReaderUnavailable(CommandError):
    """No reader configured, no token to present, the reader unreachable or refusing: the
    message says (describe shows it in its Receipts line; logs exits 2 with it)."""


async def bearer_token(kube: Any, override: str | None) -> str | None:
    """`--token`, else the token the kubeconfig's client presents (its own, a token file's
    or an exec plugin's)."""
    if override:
        return override
    token: str | None = await kube.client.bearer_token()
    return token


class ReaderClient:
    """One reader, reached directly (`url`) or through the API server's service proxy
    (`proxy`: the kubeconfig's server, TLS and own credentials, and the Service's path)."""

    def __init__(
        self,
        url: str,
        token: str,
        namespace: str,
        name: str,
        *,
        proxy: _Proxy | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        verify: Any = True
        self._where = url.rstrip("/")
        self._hint = _READER_HINT
        self._proxied = proxy is not None
        if proxy is not None:
            # The API server authenticates this request with the kubeconfig's own credential
            # (its token, or its client certificate in `verify`), then drops `Authorization`:
            # the reader reviews the person's token from Corral's header instead.
            headers = {_PERSON_HEADER: f"Bearer {token}"}
            if proxy.api_token:
                headers["Authorization"] = f"Bearer {proxy.api_token}"
            verify = proxy.tls
            self._where = f"the API server's proxy to service {proxy.service}"
            self._hint = _PROXY_HINT
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers=headers,
            verify=verify,
            timeout=httpx.Timeout(10.0, read=40.0),
        )
        self._base = f"/v1/namespaces/{namespace}/sessions/{name}"

    @classmethod
    async def from_args(cls, args: Any, kube: Any, namespace: str) -> ReaderClient:
        kube_token = await bearer_token(kube, None)
        token = args.token or kube_token
        if not token:
            raise ReaderUnavailable(
                "the archive reader needs a bearer token and the kubeconfig has none "
                "(a client certificate cannot be passed on)",
                "give --token (`kubectl create token` gives one to a ServiceAccount)",
            )
        if args.archive_url:
            return cls(args.archive_url, token, namespace, args.name)
        service_namespace, _, service = str(args.archive_service).partition("/")
        if not (service_namespace and service) or "/" in service:
            raise ReaderUnavailable(
                f"--archive-service must be NAMESPACE/NAME, not {args.archive_service!r}",
                f"e.g. {DEFAULT_ARCHIVE_SERVICE}",
            )
        config = kube.config
        url = (
            f"{str(config.server).rstrip('/')}/api/v1/namespaces/{service_namespace}"
            f"/services/{service}:{_READER_PORT_NAME}/proxy"
        )
        proxy = _Proxy(f"{service_namespace}/{service}", kube_token, config.ssl_context())
        return cls(url, token, namespace, args.name, proxy=proxy)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get(self, suffix: str, params: dict[str, Any] | None = None) -> Any:
        try:
            response = await self._http.get(self._base + suffix, params=params)
        except httpx.HTTPError as exc:
            raise ReaderUnavailable(
                f"cannot reach {self._reader()}: {type(exc).__name__}: {exc}", self._hint
            ) from exc
        from_api_server = self._proxied and _is_status(response)
        if response.status_code == 404 and not from_api_server:
            return None
        if response.status_code >= 400:
            raise ReaderUnavailable(
                f"{self._reader()} refused ({response.status_code}) {_refusal(response)}",
                _refusal_hint(response.status_code, from_api_server, self._hint),
            )
        try:
            return response.json()
        except ValueError as exc:
            raise ReaderUnavailable(f"{self._reader()} answered no JSON", self._hint) from exc

    def _reader(self) -> str:
        if self._proxied:
            return f"the archive reader through {self._where}"
        return f"the archive reader at {self._where}"

    async def transcript(self, offset: int = 0, wait: float = 0) -> dict[str, Any] | None:
        return await self._get("/transcript", {"offset": offset, "wait": wait})  # type: ignore[no-any-return]

    async def record(self) -> dict[str, Any] | None:
        return await self._get("/record")  # type: ignore[no-any-return]


class _Proxy:
    """How the API server is called on the way to the reader: the Service (for messages), the
    kubeconfig's own token (None: its client certificate, in `tls`, authenticates) and TLS."""

    def __init__(self, service: str, api_token: str | None, tls: Any) -> None:
        self.service = service
        self.api_token = api_token
        self.tls = tls


def _is_status(response: httpx.Response) -> bool:
    """A Kubernetes Status: the API server answered (no Service, no endpoints, RBAC), not the
    reader, whose refusals are `{error, reason}`."""
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("kind") == "Status"


def _refusal_hint(status: int, from_api_server: bool, hint: str) -> str | None:
    if status == 403 and from_api_server:
        return _PROXY_FORBIDDEN_HINT
    if status == 403:
        return "`corral get sessions` shows what you may read"
    if from_api_server or status in (502, 503):
        return hint
    return None


def _refusal(response: httpx.Response) -> str:
    """Why the reader refused: its own `{error, reason}`, a Kubernetes Status's message (an API
    server or a proxy in front of it), else the start of the body."""
    try:
        body = response.json()
    except ValueError:
        return " ".join(response.text.split())[:200]
    if isinstance(body, dict) and body.get("error"):
        return f"{body.get('error')}: {body.get('reason')}"
    if isinstance(body, dict) and body.get("kind") == "Status":
        return str(body.get("message") or body.get("reason") or "")
    return " ".join(response.text.split())[:200]
