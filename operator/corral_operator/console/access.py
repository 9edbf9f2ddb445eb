"""Who is asking, and what they may do: the console's two ways to a person.

- `ClusterAccess` (the console in the operator's Deployment): the person presents a Kubernetes
  bearer token; a TokenReview says who it is, a SubjectAccessReview on the namespace decides
  each request, and a decision is written with the person's own token (never the console's
  identity, never impersonation), so the API server records who decided and the chart's
  ValidatingAdmissionPolicy checks it.
- `KubeconfigAccess` (`corral console` on a workstation): the person is the kubeconfig;
  SelfSubjectAccessReviews say what they may do, and the decision is written with it.

Nothing here stores a credential: a token lives in the request (a header, or the browser's
cookie) and in a short cache keyed by its hash.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from corral_api import GROUP, VERSION
from corral_api.decisions import PENDING, approval_decision, decision_patch
from corral_kube import MERGE_PATCH, KubeRefused

from ..kube import Kube, corral_path

# A review's answer is reused this long: a revoked right stops within seconds, and a page of
# twenty requests costs one review, not twenty.
REVIEW_TTL_SECONDS = 5.0


class Refused(Exception):
    """A request the console answers with `status` and `{error, reason}`."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        self.status = status
        self.error = error
        self.reason = reason
        super().__init__(f"{status} {error}: {reason}")


@dataclass(frozen=True)
class Person:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The bearer token that proved who this is (ClusterAccess only); used for their decisions.
    token: str | None = field(default=None, repr=False, compare=False)


class Access(Protocol):
    needs_login: bool
    # Whether its Sessions are cluster objects a person may suspend and resume.
    suspends: bool

    async def authenticate(self, token: str | None) -> Person: ...

    async def allowed(
        self, person: Person, verb: str, resource: str, namespace: str, subresource: str = ""
    ) -> bool: ...

    async def decide(
        self, person: Person, namespace: str, name: str, decision: str, comment: str
    ) -> dict[str, Any]: ...

    async def patch_session(
        self, person: Person, namespace: str, name: str, spec: dict[str, Any]
    ) -> dict[str, Any]: ...


class _Cache:
    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._seen: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any) -> Any:
        found = self._seen.get(key)
        if found is None or time.monotonic() - found[0] > self._ttl:
            return None
        return found[1]

    def put(self, key: Any, value: Any) -> None:
        if len(self._seen) > 4096:  # bounded: many people, many namespaces
            self._seen.clear()
        self._seen[key] = (time.monotonic(), value)


def _attributes(verb: str, resource: str, namespace: str, subresource: str) -> dict[str, str]:
    attrs = {"namespace": namespace, "verb": verb, "group": GROUP, "resource": resource}
    if subresource:
        attrs["subresource"] = subresource
    return attrs


async def _write_decision(
    get: Any, patch: Any, user: str, namespace: str, name: str, decision: str, comment: str
) -> dict[str, Any]:
    """Read the Approval, refuse a decided one, and compare-and-swap the decision in."""
    approval = await get()
    if approval is None:
        raise Refused(404, "not_found", f"approval {name} not found in {namespace}")
    current = approval_decision(approval)
    if current != PENDING:
        raise Refused(409, "already_decided", f"approval {name} is already {current}")
    return dict(await patch(decision_patch(approval, decision, user, comment, datetime.now(UTC))))


def _refusal(status: int, message: str) -> Refused:
    error = {401: "unauthenticated", 403: "forbidden", 404: "not_found", 409: "conflict"}
    return Refused(status, error.get(status, "refused"), message)


class ClusterAccess:
    """People by bearer token, checked by the API server (TokenReview, SubjectAccessReview)."""

    needs_login = True
    suspends = True

    def __init__(self, kube: Kube) -> None:
        self._kube = kube  # the console's own identity: reviews only, never a person's write
        # A person's writes go straight to the API server with their token and nothing else of
        # ours: no client certificate, no console token.
        verify = kube.config.ssl_context(client_cert=False)
        self._people = httpx.AsyncClient(base_url=kube.config.server, verify=verify, timeout=30.0)
        self._tokens = _Cache(REVIEW_TTL_SECONDS)
        self._reviews = _Cache(REVIEW_TTL_SECONDS)

    async def aclose(self) -> None:
        await self._people.aclose()

    async def authenticate(self, token: str | None) -> Person:
        if not token:
            raise Refused(401, "unauthenticated", "sign in with a Kubernetes bearer token")
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._tokens.get(key)
        if cached is not None:
            return Person(**{**cached.__dict__, "token": token})
        review = await self._kube.request(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = (review or {}).get("status") or {}
        user = status.get("user") or {}
        if not status.get("authenticated") or not user.get("username"):
            raise Refused(
                401, "unauthenticated", str(status.get("error") or "the token was not accepted")
            )
        person = Person(
            name=str(user["username"]),
            groups=tuple(user.get("groups") or ()),
            uid=str(user.get("uid") or ""),
            extra=tuple(sorted((k, tuple(v)) for k, v in (user.get("extra") or {}).items())),
        )
        self._tokens.put(key, person)
        return Person(**{**person.__dict__, "token": token})

    async def allowed(
        self, person: Person, verb: str, resource: str, namespace: str, subresource: str = ""
    ) -> bool:
        key = (person.name, person.groups, person.uid, verb, resource, namespace, subresource)
        cached = self._reviews.get(key)
        if cached is not None:
            return bool(cached)
        spec: dict[str, Any] = {
            "user": person.name,
            "groups": list(person.groups),
            "resourceAttributes": _attributes(verb, resource, namespace, subresource),
        }
        if person.uid:
            spec["uid"] = person.uid
        if person.extra:
            spec["extra"] = {k: list(v) for k, v in person.extra}
        review = await self._kube.request(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
        )
        allowed = bool(((review or {}).get("status") or {}).get("allowed"))
        self._reviews.put(key, allowed)
        return allowed

    async def decide(
        self, person: Person, namespace: str, name: str, decision: str, comment: str
    ) -> dict[str, Any]:
        if not person.token:
            raise Refused(401, "unauthenticated", "a decision needs your own token")
        path = corral_path("Approval", namespace, name)
        headers = {"Authorization": f"Bearer {person.token}", "Accept": "application/json"}

        async def get() -> dict[str, Any] | None:
            answer = await self._people.get(path, headers=headers)
            if answer.status_code == 404:
                return None
            self._raise(answer)
            return dict(answer.json())

        async def patch(body: dict[str, Any]) -> dict[str, Any]:
            answer = await self._people.patch(
                f"{path}/status",
                json=body,
                headers={**headers, "Content-Type": MERGE_PATCH},
            )
            self._raise(answer)
            return dict(answer.json())

        return await _write_decision(get, patch, person.name, namespace, name, decision, comment)

    async def patch_session(
        self, person: Person, namespace: str, name: str, spec: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge `spec` into the Session with the person's own token (suspend, resume)."""
        if not person.token:
            raise Refused(401, "unauthenticated", "a change needs your own token")
        answer = await self._people.patch(
            corral_path("Session", namespace, name),
            json={"spec": spec},
            headers={
                "Authorization": f"Bearer {person.token}",
                "Accept": "application/json",
                "Content-Type": MERGE_PATCH,
            },
        )
        self._raise(answer)
        return dict(answer.json())

    @staticmethod
    def _raise(answer: httpx.Response) -> None:
        if answer.status_code < 400:
            return
        try:
            message = str(answer.json().get("message") or answer.text)
        except ValueError:
            message = answer.text
        raise _refusal(answer.status_code, f"the API server refused: {message}")


class KubeconfigAccess:
    """The person is the kubeconfig's user: `corral console` on their own machine."""

    needs_login = False
    suspends = True

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._me: Person | None = None
        self._reviews = _Cache(REVIEW_TTL_SECONDS)

    async def aclose(self) -> None:
        """The kubeconfig's client belongs to the caller."""

    async def authenticate(self, token: str | None) -> Person:
        if self._me is None:
            review = await self._kube.request(
                "POST",
                "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            )
            info = ((review or {}).get("status") or {}).get("userInfo") or {}
            if not info.get("username"):
                raise Refused(401, "unauthenticated", "the API server did not say who you are")
            self._me = Person(name=str(info["username"]), groups=tuple(info.get("groups") or ()))
        return self._me

    async def allowed(
        self, person: Person, verb: str, resource: str, namespace: str, subresource: str = ""
    ) -> bool:
        key = (verb, resource, namespace, subresource)
        cached = self._reviews.get(key)
        if cached is not None:
            return bool(cached)
        review = await self._kube.request(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": _attributes(verb, resource, namespace, subresource)},
            },
        )
        allowed = bool(((review or {}).get("status") or {}).get("allowed"))
        self._reviews.put(key, allowed)
        return allowed

    async def decide(
        self, person: Person, namespace: str, name: str, decision: str, comment: str
    ) -> dict[str, Any]:
        path = corral_path("Approval", namespace, name)

        async def get() -> dict[str, Any] | None:
            try:
                return await self._kube.get(path)
            except KubeRefused as err:
                raise _refusal(err.status, f"the API server refused: {err.message}") from None

        async def patch(body: dict[str, Any]) -> dict[str, Any]:
            try:
                found = await self._kube.request(
                    "PATCH", f"{path}/status", body=body, content_type=MERGE_PATCH
                )
            except KubeRefused as err:
                raise _refusal(err.status, f"the API server refused: {err.message}") from None
            return dict(found) if isinstance(found, dict) else {}

        return await _write_decision(get, patch, person.name, namespace, name, decision, comment)

    async def patch_session(
        self, person: Person, namespace: str, name: str, spec: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge `spec` into the Session with the kubeconfig's identity (suspend, resume)."""
        try:
            found = await self._kube.request(
                "PATCH", corral_path("Session", namespace, name), body={"spec": spec},
                content_type=MERGE_PATCH,
            )  # fmt: skip
        except KubeRefused as err:
            raise _refusal(err.status, f"the API server refused: {err.message}") from None
        return dict(found) if isinstance(found, dict) else {}


API_VERSION = f"{GROUP}/{VERSION}"
