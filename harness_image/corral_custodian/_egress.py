"""The custodian's way out through the egress gateway (docs/egress.md): every outbound request
of this process and its git carries the Session's proxy credential. A cold custodian sets it at
start; an adopted one when its adopt delivers the credential (`_adopt`)."""

from __future__ import annotations

from collections.abc import MutableMapping
from urllib.parse import quote, urlsplit, urlunsplit

from .settings import EGRESS_PROXY_USER, CustodianSettings


def use_egress_gateway(settings: CustodianSettings, env: MutableMapping[str, str]) -> None:
    """Send every outbound request of this process and its git through the egress gateway
    with the Session's proxy credential: httpx and git read the usual proxy variables, and
    git:// remotes tunnel through CONNECT (corral-proxy-tunnel)."""
    if settings.egress_proxy is None or settings.egress_credential is None:
        return
    parts = urlsplit(settings.egress_proxy)
    user = quote(EGRESS_PROXY_USER, safe="")
    secret = quote(settings.egress_credential, safe="")
    url = urlunsplit((parts.scheme, f"{user}:{secret}@{parts.netloc}", "", "", ""))
    for name in ("HTTPS_PROXY", "HTTP_PROXY"):
        env[name] = env[name.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    env["GIT_PROXY_COMMAND"] = "corral-proxy-tunnel"
