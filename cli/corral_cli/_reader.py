"""What `corral describe` and `corral logs` share: the client of the operator's archive
reader (docs/history.md), which serves a Session's transcript and receipts, live while its
sandbox serves and archived after its pod is gone.

The reader is reached at `--archive-url` (or `$CORRAL_ARCHIVE_URL`), e.g. a port-forward of
the chart's `corral-archive` Service. It authorises each request by asking the API server
whether the caller's own token may `get` the Session, so the token sent is the kubeconfig's
bearer token (`--token` overrides it); client-certificate kubeconfigs have none to send.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from ._errors import CommandError

ARCHIVE_URL_ENV = "CORRAL_ARCHIVE_URL"
_READER_HINT = (
    f"give the reader's URL with --archive-url or ${ARCHIVE_URL_ENV} (e.g. a port-forward of "
    "svc/corral-archive, docs/cli.md)"
)


def add_reader_options(p: Any) -> None:
    p.add_argument(
        "--archive-url",
        default=os.environ.get(ARCHIVE_URL_ENV),
        help=f"the operator's archive reader (default ${ARCHIVE_URL_ENV})",
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
    def __init__(self, url: str, token: str, namespace: str, name: str) -> None:
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(10.0, read=40.0),
        )
        self._base = f"/v1/namespaces/{namespace}/sessions/{name}"

    @classmethod
    async def from_args(cls, args: Any, kube: Any, namespace: str) -> ReaderClient:
        if not args.archive_url:
            raise ReaderUnavailable("no archive reader configured", _READER_HINT)
        token = await bearer_token(kube, args.token)
        if not token:
            raise ReaderUnavailable(
                "the archive reader needs a bearer token and the kubeconfig has none "
                "(a client certificate cannot be passed on)",
                "give --token (`kubectl create token` gives one to a ServiceAccount)",
            )
        return cls(args.archive_url, token, namespace, args.name)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get(self, suffix: str, params: dict[str, Any] | None = None) -> Any:
        try:
            response = await self._http.get(self._base + suffix, params=params)
        except httpx.HTTPError as exc:
            raise ReaderUnavailable(
                f"cannot reach the archive reader at {self._http.base_url}: "
                f"{type(exc).__name__}: {exc}",
                _READER_HINT,
            ) from exc
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise ReaderUnavailable(
                f"the archive reader refused ({response.status_code}) {_refusal(response)}",
                "`corral get sessions` shows what you may read" if response.status_code == 403
                else None,
            )  # fmt: skip
        try:
            return response.json()
        except ValueError as exc:
            raise ReaderUnavailable(
                f"the archive reader at {self._http.base_url} answered no JSON", _READER_HINT
            ) from exc

    async def transcript(self, offset: int = 0, wait: float = 0) -> dict[str, Any] | None:
        return await self._get("/transcript", {"offset": offset, "wait": wait})  # type: ignore[no-any-return]

    async def record(self) -> dict[str, Any] | None:
        return await self._get("/record")  # type: ignore[no-any-return]


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
