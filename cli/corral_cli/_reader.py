"""What `corral describe` and `corral logs` share: the exit-2 guard, and the client of the
operator's archive reader (docs/history.md), which serves a Session's transcript and receipts,
live while its sandbox serves and archived after its pod is gone.

The reader is reached at `--archive-url` (or `$CORRAL_ARCHIVE_URL`), e.g. a port-forward of
the chart's `corral-archive` Service. It authorises each request by asking the API server
whether the caller's own token may `get` the Session, so the token sent is the kubeconfig's
bearer token (`--token` overrides it); client-certificate kubeconfigs have none to send.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Coroutine
from typing import Any

import httpx

from ._cluster import EXIT_ERROR

ARCHIVE_URL_ENV = "CORRAL_ARCHIVE_URL"


def guarded(what: str, work: Coroutine[Any, Any, int]) -> int:
    """Any unexpected error exits 2 with its message, never a traceback and never 1."""
    try:
        return int(asyncio.run(work))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        print(f"corral {what}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR


def add_reader_options(p: Any) -> None:
    p.add_argument(
        "--archive-url",
        default=os.environ.get(ARCHIVE_URL_ENV),
        help=f"the operator's archive reader (default ${ARCHIVE_URL_ENV})",
    )
    p.add_argument("--token", help="bearer token to present (default: the kubeconfig's)")


class ReaderUnavailable(Exception):
    """No reader configured, no token to present, or the reader refused: the message says."""


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
            raise ReaderUnavailable(
                f"no archive reader configured: give --archive-url or set ${ARCHIVE_URL_ENV}"
            )
        token = await bearer_token(kube, args.token)
        if not token:
            raise ReaderUnavailable(
                "the archive reader needs a bearer token and the kubeconfig has none "
                "(a client certificate cannot be passed on): give --token"
            )
        return cls(args.archive_url, token, namespace, args.name)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get(self, suffix: str, params: dict[str, Any] | None = None) -> Any:
        response = await self._http.get(self._base + suffix, params=params)
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            try:
                body = response.json()
                why = f"{body.get('error')}: {body.get('reason')}"
            except ValueError:
                why = response.text[:200]
            raise ReaderUnavailable(f"the archive reader refused ({response.status_code}) {why}")
        return response.json()

    async def transcript(self, offset: int = 0, wait: float = 0) -> dict[str, Any] | None:
        return await self._get("/transcript", {"offset": offset, "wait": wait})  # type: ignore[no-any-return]

    async def record(self) -> dict[str, Any] | None:
        return await self._get("/record")  # type: ignore[no-any-return]
