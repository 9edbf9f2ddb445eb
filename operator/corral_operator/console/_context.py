"""What every console route shares: `ConsoleContext` (who a request's person is and what they
may read) and the reading of a request itself (its token, its form, where it came from)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import Request

from corral_kube import Forbidden, KubeError

from .access import Access, Person, Refused
from .reader import PLURALS, Source

Obj = dict[str, Any]
COOKIE = "corral_token"


@dataclass(frozen=True)
class ConsoleContext:
    """The console's access and reader, and the checks every route makes with them."""

    access: Access
    reader: Source
    secure_cookie: bool = False

    async def person_of(self, request: Request) -> Person:
        try:
            return await self.access.authenticate(token_of(request))
        except KubeError as err:
            raise Refused(503, "cluster_unavailable", err.message) from None

    async def may(self, person: Person, verb: str, resource: str, ns: str, sub: str = "") -> bool:
        try:
            return await self.access.allowed(person, verb, resource, ns, sub)
        except KubeError as err:
            raise Refused(503, "cluster_unavailable", err.message) from None

    async def require(
        self, person: Person, verb: str, resource: str, ns: str, sub: str = ""
    ) -> None:
        if not await self.may(person, verb, resource, ns, sub):
            what = f"{resource}/{sub}" if sub else resource
            raise Refused(
                403, "forbidden", f"{person.name} may not {verb} {what} in namespace {ns}"
            )

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The object, or None when there is none this console shows: in a namespace it does
        not serve, or one its own identity may not read (then it is not one it shows either;
        the person's own right was checked first, so this tells them nothing more)."""
        shown = self.reader.namespaces
        if shown is not None and namespace not in shown:
            return None
        try:
            return await self.reader.get(kind, namespace, name)
        except Forbidden:
            return None

    async def readable(self, person: Person, kind: str) -> dict[str, list[Obj]]:
        """Every object of `kind` in the namespaces this person may list it in."""
        resource = PLURALS[kind]
        reader = self.reader
        if reader.namespaces is not None:
            allowed = [
                ns for ns in reader.namespaces if await self.may(person, "list", resource, ns)
            ]
            return {ns: await reader.objects(kind, ns) for ns in allowed}
        everything = await reader.list_everywhere(kind)
        return {
            ns: items
            for ns, items in everything.items()
            if await self.may(person, "list", resource, ns)
        }


def token_of(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return request.cookies.get(COOKIE) or None


async def form_of(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the pages post nothing else; no multipart parser needed)."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise Refused(400, "bad_request", "expected an urlencoded form")
    text = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[0] for k, v in parse_qs(text, max_num_fields=16).items()}


async def json_object_of(request: Request) -> dict[str, Any]:
    """A JSON object body (the read API's writes take nothing else)."""
    try:
        body = await request.json()
    except ValueError:
        raise Refused(400, "bad_request", "the body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "bad_request", "the body is not a JSON object")
    return body


def wants_html(request: Request) -> bool:
    return not request.url.path.startswith("/api/")


def same_origin(request: Request) -> bool:
    """A POST must come from the console's own pages (or from a client that sends no Origin,
    such as curl). The sign-in cookie is SameSite=Strict as well."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return request.headers.get("content-type", "").startswith("application/json")
    return urlsplit(origin).netloc == request.headers.get("host", "")


def require_same_origin(request: Request) -> None:
    if not same_origin(request):
        raise Refused(403, "forbidden", "cross-site request refused")
