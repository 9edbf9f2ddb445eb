"""A Session's wire token: the one this operator process wrote into the Session's Secret, else
read back from that Secret, and only from a Secret the Session controls."""

from __future__ import annotations

import base64

from corral_kube import Conflict, NotFound

from .. import naming
from ..builders.podbuilder import WIRE_TOKEN_KEY
from ..kube import Kube, object_path
from ..planning.session import ownership


async def read_wire_token(
    kube: Kube,
    namespace: str,
    session: str,
    uid: str,
    written: dict[tuple[str, str], tuple[str, str]] | None = None,
) -> str:
    """The Session's wire token: the one this process wrote into its Secret (`written`), else
    read from its own Secret only: one it does not control is refused."""
    kept_uid, token = (written or {}).get((namespace, session), ("", ""))
    if token and kept_uid == uid:
        return token
    path = object_path("v1", "Secret", namespace, naming.wire_secret_name(session))
    secret = await kube.get(path)
    if secret is None:
        raise NotFound(404, f"wire token secret {path} is missing")
    if ownership(secret, session, uid) != "ours":
        raise Conflict(409, f"the Secret {path} is not owned by this Session; it is not used")
    return base64.b64decode(secret["data"][WIRE_TOKEN_KEY]).decode()
