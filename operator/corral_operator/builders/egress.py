"""A sandbox's egress as the gateway enforces it (docs/egress.md, ADR 0102): the binding the
operator writes on the pod, the proxy settings the containers get, and the NetworkPolicy rule
that leaves the gateway as the pod's only way out.

Two identities share the pod's one address. The custodian's requests carry its Session's proxy
credential (the gateway compares its SHA-256 with the binding's) and may reach the
credentialed destinations the operator derives here: the model upstream, the API server, the
Session's git host, the Agent's http hooks, the trace collector and the platform's list. A
request without it is the agent's and reaches only its Agent's `sandbox.egress`. Pure: plain
dicts in, plain dicts out.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import shlex
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from corral_api.kinds import Agent, EgressRule
from corral_api.providers import ProviderError, choose_provider

from .. import naming
from ..settings import EgressGateway, EgressTarget, OperatorSettings
from ._pod_layout import env

BINDING_VERSION = 1
# The first line of every signed binding: a signature made for anything else never matches.
SIGNATURE_CONTEXT = "corral.dev/egress-binding/v1"
# The user name of the custodian's proxy credential (the gateway reads only the password).
PROXY_USER = "custodian"
_DEFAULT_PORTS = {
    "https": 443,
    "http": 80,
    "git": 9418,
    "ssh": 22,
    "postgresql": 5432,
    "postgres": 5432,
}
# Addresses the tools' clients reach without the gateway: the pod's own, by name, loopback and
# its pod address (a tool that talks to its own pod must not be sent away; the gateway would
# refuse it as a private address). POD_IP_ENV comes first so the kubelet expands it here.
POD_IP_ENV = "POD_IP"
NO_PROXY = f"localhost,127.0.0.1,::1,$({POD_IP_ENV})"
# git:// remotes (no HTTP) reach the gateway as a CONNECT tunnel through this command, which
# reads the proxy (and its credential) from HTTPS_PROXY (corral_common.proxytunnel).
GIT_PROXY_COMMAND = "corral-proxy-tunnel"


def credential_sha256(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


def rule_of(rule: EgressRule) -> dict[str, Any]:
    """An Agent's (or an Evidence's) rule as the gateway reads it."""
    out: dict[str, Any] = {"ports": list(rule.ports)}
    if rule.host is not None:
        out["host"] = rule.host
        if rule.methods:
            out["methods"] = list(rule.methods)
    else:
        out["cidr"] = rule.cidr
    return out


def platform_rule(target: EgressTarget) -> dict[str, Any]:
    """A platform destination: trusted, so it may name a private address."""
    out: dict[str, Any] = {"ports": list(target.ports), "private": True}
    if target.host is not None:
        out["host"] = target.host
    else:
        out["cidr"] = target.cidr
    return out


def url_rule(url: str, *, private: bool) -> dict[str, Any] | None:
    """The rule that reaches `url`'s host and port; None for a URL without a host (a path)."""
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        scp = _scp_host(url)
        if scp is None:
            return None
        return {"host": scp, "ports": [22], "private": private}
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 443)
    except ValueError:
        return None
    return {"host": parts.hostname, "ports": [port], "private": private}


def dsn_rule(dsn: str) -> dict[str, Any] | None:
    """The rule that reaches a PostgreSQL DSN's host, as a URL (`postgresql://...`) or in
    libpq's `key=value` form; None for a DSN without a host or with a socket directory."""
    if "://" in dsn:
        return url_rule(dsn, private=True)
    fields: dict[str, str] = {}
    try:
        words = shlex.split(dsn)
    except ValueError:
        return None  # libpq refuses it too
    for word in words:
        key, sep, value = word.partition("=")
        if sep:
            fields[key.strip()] = value
    host = fields.get("host", "").split(",")[0]
    if not host or host.startswith("/"):
        return None
    try:
        port = int(fields.get("port", "").split(",")[0] or 5432)
    except ValueError:
        return None
    return {"host": host, "ports": [port], "private": True}


def _scp_host(url: str) -> str | None:
    """`git@host:path`, git's scp-like ssh form: its host."""
    if "://" in url or ":" not in url or url.startswith("/"):
        return None
    head = url.split(":", 1)[0]
    host = head.rsplit("@", 1)[-1]
    return host or None


def custodian_rules(
    agent: Agent, repo: str | None, settings: OperatorSettings
) -> list[dict[str, Any]]:
    """Where the custodian may go: the operator's own destinations (trusted), the Session's
    git host and the Agent's http hooks (named by users, so never a private address unless
    written as an address)."""
    rules: list[dict[str, Any] | None] = [
        *(url_rule(url, private=True) for url in _provider_urls(agent, settings)),
        url_rule(settings.kube_api_url, private=True),
    ]
    if settings.otlp_endpoint:
        rules.append(url_rule(settings.otlp_endpoint, private=True))
    if settings.memory_dsn:
        rules.append(dsn_rule(settings.memory_dsn))
    rules.extend(platform_rule(t) for t in settings.platform_egress)
    if repo:
        rules.append(url_rule(repo, private=False))
    for phase in type(agent.spec.hooks).model_fields:
        value = getattr(agent.spec.hooks, phase)
        if isinstance(value, list):
            for hook in value:
                if hook.http is not None:
                    rules.append(url_rule(hook.http.url, private=False))
    return _unique(r for r in rules if r is not None)


def _provider_urls(agent: Agent, settings: OperatorSettings) -> list[str]:
    """The Agent's provider's endpoints (docs/providers.md): the platform's, so trusted. An
    Agent naming no defined provider gets none (check_sandbox refuses it before any pod)."""
    try:
        provider = choose_provider(
            settings.model_providers, agent.spec.provider, settings.model_upstream_url
        )
    except ProviderError:
        return []
    return provider.destinations()


def checkout_rules(repo: str | None) -> list[dict[str, Any]]:
    """What a checkout without the custodian's credential needs: the git host (an Evidence's
    pod, a pooled pod's adoption)."""
    rule = url_rule(repo, private=False) if repo else None
    return [rule] if rule is not None else []


def _unique(rules: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for rule in rules:
        key = json.dumps(rule, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(rule)
    return out


def binding_signature(key: str, namespace: str, pod: str, value: str) -> str:
    """HMAC-SHA256 of the binding for one pod name in one namespace, with the key the operator
    and the gateway share: whoever may create pods in a Session's namespace can copy the
    label and write an annotation, but cannot sign it (docs/egress.md)."""
    message = "\n".join((SIGNATURE_CONTEXT, namespace, pod, value)).encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def binding(
    *,
    namespace: str,
    pod: str,
    session: str,
    agent: str,
    credential: str | None,
    agent_rules: Sequence[dict[str, Any]],
    custodian: Sequence[dict[str, Any]] = (),
    checkout: Sequence[dict[str, Any]] = (),
    key: str | None = None,
) -> dict[str, str]:
    """The pod's binding annotation: who it serves, the SHA-256 of its custodian's credential
    (never the credential) and each identity's rules; with `key`, its signature beside it."""
    value = {
        "v": BINDING_VERSION,
        "namespace": namespace,
        "session": session,
        "agent": agent,
        "credentialSha256": credential_sha256(credential) if credential else "",
        "agentRules": list(agent_rules),
        "custodianRules": list(custodian),
        "checkoutRules": list(checkout),
    }
    text = json.dumps(value, sort_keys=True)
    out = {naming.ANNOTATION_EGRESS_BINDING: text}
    if key:
        out[naming.ANNOTATION_EGRESS_SIGNATURE] = binding_signature(key, namespace, pod, text)
    return out


def egress_labels(settings: OperatorSettings) -> dict[str, str]:
    """The label the gateway's watch selects; none without a gateway."""
    if settings.egress_gateway is None:
        return {}
    return {naming.LABEL_EGRESS: naming.EGRESS_VIA_GATEWAY}


# ------------------------------------------------------------------- the NetworkPolicy


def gateway_peer_rule(gateway: EgressGateway) -> dict[str, Any]:
    """Egress to the gateway's pods on its proxy port: the pod's one way out (no DNS)."""
    return {
        "to": [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": gateway.namespace}
                },
                "podSelector": {"matchLabels": dict(gateway.pod_labels)},
            }
        ],
        "ports": [{"protocol": "TCP", "port": gateway.policy_port}],
    }


def cidr_rule(cidr: str, ports: Sequence[int]) -> dict[str, Any]:
    rule: dict[str, Any] = {"to": [{"ipBlock": {"cidr": cidr}}]}
    if ports:
        rule["ports"] = [{"protocol": "TCP", "port": p} for p in ports]
    return rule


def dns_rule(settings: OperatorSettings) -> dict[str, Any]:
    """DNS (UDP and TCP 53) to the cluster's DNS pods only, as the operator's settings name them
    (without a gateway only)."""
    return {
        "to": [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": settings.dns_namespace}
                },
                "podSelector": {"matchLabels": dict(settings.dns_pod_labels)},
            }
        ],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }


def policy_egress(
    settings: OperatorSettings, rules: Sequence[EgressRule | EgressTarget], *, dns: bool = True
) -> list[dict[str, Any]]:
    """The NetworkPolicy's egress: the gateway alone (no DNS). Without one, the CIDR rules (a
    host rule cannot be a NetworkPolicy, so it reaches nothing) and, when `dns` and the
    settings allow it, DNS to the cluster's DNS pods."""
    if settings.egress_gateway is not None:
        return [gateway_peer_rule(settings.egress_gateway)]
    out = [cidr_rule(r.cidr, r.ports) for r in rules if r.cidr is not None]
    if dns and settings.allow_dns:
        out.insert(0, dns_rule(settings))
    return out


# ------------------------------------------------------------------ proxy settings


def proxy_url(settings: OperatorSettings, credential_var: str | None = None) -> str | None:
    """The gateway as a proxy URL; with the credential (a variable the kubelet expands) for
    the custodian's side."""
    gateway = settings.egress_gateway
    if gateway is None:
        return None
    host = gateway.address
    if _is_v6(host):
        host = f"[{host}]"
    auth = f"{PROXY_USER}:$({credential_var})@" if credential_var else ""
    return f"http://{auth}{host}:{gateway.port}"


def _is_v6(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 6
    except ValueError:
        return False


def proxy_env(url: str | None) -> list[dict[str, Any]]:
    """HTTP(S)_PROXY in both spellings and NO_PROXY: pip, npm, cargo, go, git and curl
    read one or the other. Nothing without a gateway."""
    if url is None:
        return []
    out: list[dict[str, Any]] = [
        {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    ]
    for name in ("HTTPS_PROXY", "HTTP_PROXY"):
        out += [env(name, url), env(name.lower(), url)]
    out += [env("NO_PROXY", NO_PROXY), env("no_proxy", NO_PROXY)]
    return out
