"""The sandbox pod's optional parts: each a volume (or none) with the mounts, variables and
checkout arguments it adds to the containers that use it, as the Agent's credentials and the
operator's settings ask for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral_api.kinds import Credentials, SecretKeyRef, SecretRef
from corral_api.providers import STS_AUDIENCE, ModelProvider
from corral_common.logs import LOG_FORMAT_ENV

from ..settings import OperatorSettings
from ._pod_layout import (
    AWS_CREDENTIALS_DIR,
    AWS_WEB_IDENTITY_DIR,
    EGRESS_CREDENTIAL_ENV,
    EGRESS_CREDENTIAL_KEY,
    EGRESS_DIR,
    GCP_KEY_DIR,
    GIT_CREDENTIALS_DIR,
    HOOK_SECRET_DIR,
    MEMORY_DIR,
    MEMORY_DSN_KEY,
    MEMORY_SOCKET_DIR,
    MODEL_CATALOG_DIR,
    MODEL_CATALOG_KEY,
    MODEL_KEY_DIR,
    PROVIDER_ENV,
    env,
    mount,
)
from .egress import GIT_PROXY_COMMAND, proxy_env, proxy_url


@dataclass
class PodAdditions:
    """What the optional parts add, each list in the order the pod lists it after the parts
    every pod has."""

    volumes: list[dict[str, Any]] = field(default_factory=list)
    harness_env: list[dict[str, Any]] = field(default_factory=list)
    harness_mounts: list[dict[str, Any]] = field(default_factory=list)
    custodian_env: list[dict[str, Any]] = field(default_factory=list)
    custodian_mounts: list[dict[str, Any]] = field(default_factory=list)
    checkout_mounts: list[dict[str, Any]] = field(default_factory=list)
    checkout_args: list[str] = field(default_factory=list)
    checkout_env: list[dict[str, Any]] = field(default_factory=list)
    tools_env: list[dict[str, Any]] = field(default_factory=list)


def pod_additions(
    credentials: Credentials,
    settings: OperatorSettings,
    wire_secret: str,
    provider: ModelProvider | None = None,
) -> PodAdditions:
    """The optional parts the Agent's credentials and the settings ask for; the order of the
    calls is the order of the variables, mounts and volumes in the pod."""
    added = PodAdditions()
    if provider is not None and provider.type in ("bedrock", "vertex"):
        _add_cloud_provider(added, provider, credentials, settings)
    else:
        if provider is not None and settings.model_providers:
            added.custodian_env.append(env(PROVIDER_ENV, provider.to_json()))
        if credentials.model_secret_ref:
            _add_model_key(added, credentials.model_secret_ref)
    if credentials.git_secret_ref:
        _add_git_credentials(added, credentials.git_secret_ref)
    if credentials.hook_secret_ref:
        _add_hook_secret(added, credentials.hook_secret_ref)
    if settings.memory_dsn:
        _add_memory(added, settings, wire_secret)
    if settings.log_format != "text":
        # The harness and the custodian log as the operator does (docs/observability.md).
        added.harness_env.append(env(LOG_FORMAT_ENV, settings.log_format))
        added.custodian_env.append(env(LOG_FORMAT_ENV, settings.log_format))
    if settings.otlp_endpoint:
        # Traces of each run leave over OTLP (docs/tracing.md); unset, the SDK is not loaded.
        # One path, gateway or not: the harness exports to its custodian's relay (with the
        # pod-local credential), the custodian alone to the collector (through the gateway
        # with the Session's proxy credential when there is one). The relay's URL builds on
        # the harness's CORRAL_CUSTODIAN_URL, listed before it (a dependent variable).
        added.harness_env += [
            env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "$(CORRAL_CUSTODIAN_URL)/otlp/v1/traces"),
            env("OTEL_SERVICE_NAME", "corral-harness"),
        ]
        added.custodian_env.append(env("CORRAL_OTLP_ENDPOINT", settings.otlp_endpoint))
    if settings.model_catalog_configmap:
        _add_model_catalog(added, settings.model_catalog_configmap)
    if settings.egress_gateway is not None:
        _add_egress(added, settings, wire_secret)
    return added


def _add_egress(added: PodAdditions, settings: OperatorSettings, wire_secret: str) -> None:
    # The egress gateway (docs/egress.md): the tools' clients find it in the usual proxy
    # variables, without a credential (the agent's identity); the custodian's credential is
    # one item of the Session's Secret, in the custodian alone, and the checkout (which runs
    # before the agent's container starts) gets it as a variable for its clone.
    # git:// remotes tunnel through CONNECT too (a warm pod's adopt runs its checkout here).
    added.tools_env += [
        *proxy_env(proxy_url(settings)),
        env("GIT_PROXY_COMMAND", GIT_PROXY_COMMAND),
    ]
    added.volumes.append(
        {
            "name": "egress",
            "secret": {
                "secretName": wire_secret,
                "defaultMode": 0o440,
                "items": [{"key": EGRESS_CREDENTIAL_KEY, "path": "credential"}],
            },
        }
    )
    added.custodian_mounts.append(mount("egress", EGRESS_DIR, read_only=True))
    added.custodian_env += [
        env("CORRAL_EGRESS_PROXY", str(proxy_url(settings))),
        env("CORRAL_EGRESS_CREDENTIAL_FILE", f"{EGRESS_DIR}/credential"),
    ]
    added.checkout_env += [
        {
            "name": EGRESS_CREDENTIAL_ENV,
            "valueFrom": {"secretKeyRef": {"name": wire_secret, "key": EGRESS_CREDENTIAL_KEY}},
        },
        *proxy_env(proxy_url(settings, EGRESS_CREDENTIAL_ENV)),
        env("GIT_PROXY_COMMAND", GIT_PROXY_COMMAND),
    ]


def _add_cloud_provider(
    added: PodAdditions,
    provider: ModelProvider,
    credentials: Credentials,
    settings: OperatorSettings,
) -> None:
    # The platform's entry, and the one credential it takes, in the custodian alone
    # (docs/providers.md); the model key of an anthropic provider is not mounted for it.
    added.custodian_env.append(env(PROVIDER_ENV, provider.to_json()))
    if provider.type == "vertex" and credentials.gcp_secret_ref is not None:
        ref = credentials.gcp_secret_ref
        added.volumes.append(
            {
                "name": "gcp-key",
                "secret": {
                    "secretName": ref.name,
                    "defaultMode": 0o440,
                    "items": [{"key": ref.key, "path": "key.json"}],
                },
            }
        )
        added.custodian_mounts.append(mount("gcp-key", GCP_KEY_DIR, read_only=True))
        added.custodian_env.append(env("CORRAL_GCP_KEY_FILE", f"{GCP_KEY_DIR}/key.json"))
    if provider.type != "bedrock":
        return
    if credentials.aws_secret_ref is not None:
        # The whole Secret: aws_session_token is optional, and an item naming a key the
        # Secret lacks would keep the pod from starting.
        added.volumes.append(
            {
                "name": "aws-credentials",
                "secret": {"secretName": credentials.aws_secret_ref.name, "defaultMode": 0o440},
            }
        )
        added.custodian_mounts.append(mount("aws-credentials", AWS_CREDENTIALS_DIR, read_only=True))
        added.custodian_env.append(env("CORRAL_AWS_CREDENTIALS_DIR", AWS_CREDENTIALS_DIR))
    elif provider.web_identity:
        # A second projected token, for STS alone, in the custodian alone: the pod's service
        # account is shared by every sandbox, so the role it assumes is the platform's
        # (a per-Agent role is chained from it; docs/providers.md).
        added.volumes.append(
            {
                "name": "aws-web-identity",
                "projected": {
                    "defaultMode": 0o440,
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": STS_AUDIENCE,
                                "expirationSeconds": settings.token_expiry_seconds,
                                "path": "token",
                            }
                        }
                    ],
                },
            }
        )
        added.custodian_mounts.append(
            mount("aws-web-identity", AWS_WEB_IDENTITY_DIR, read_only=True)
        )
        added.custodian_env.append(
            env("CORRAL_AWS_WEB_IDENTITY_TOKEN_FILE", f"{AWS_WEB_IDENTITY_DIR}/token")
        )


def _add_model_key(added: PodAdditions, ref: SecretKeyRef) -> None:
    added.volumes.append(
        {
            "name": "model-key",
            "secret": {
                "secretName": ref.name,
                "defaultMode": 0o440,
                "items": [{"key": ref.key, "path": "key"}],
            },
        }
    )
    added.custodian_mounts.append(mount("model-key", MODEL_KEY_DIR, read_only=True))
    added.custodian_env.append(env("CORRAL_MODEL_KEY_FILE", f"{MODEL_KEY_DIR}/key"))


def _add_git_credentials(added: PodAdditions, ref: SecretKeyRef) -> None:
    # For the custodian's pushes and for the checkout's clone; never for the agent's side.
    added.volumes.append(
        {
            "name": "git-credentials",
            "secret": {
                "secretName": ref.name,
                "defaultMode": 0o440,
                "items": [{"key": ref.key, "path": "credentials"}],
            },
        }
    )
    git_mount = mount("git-credentials", GIT_CREDENTIALS_DIR, read_only=True)
    added.custodian_mounts.append(git_mount)
    added.checkout_mounts.append(dict(git_mount))
    added.custodian_env.append(
        env("CORRAL_GIT_CREDENTIALS_FILE", f"{GIT_CREDENTIALS_DIR}/credentials")
    )
    added.checkout_args.append(f"{GIT_CREDENTIALS_DIR}/credentials")


def _add_hook_secret(added: PodAdditions, ref: SecretRef) -> None:
    # Every key, for the custodian alone: it adds them to http hooks' requests.
    added.volumes.append(
        {"name": "hook-secret", "secret": {"secretName": ref.name, "defaultMode": 0o440}}
    )
    added.custodian_mounts.append(mount("hook-secret", HOOK_SECRET_DIR, read_only=True))
    added.custodian_env.append(env("CORRAL_HOOK_SECRET_DIR", HOOK_SECRET_DIR))


def _add_memory(added: PodAdditions, settings: OperatorSettings, wire_secret: str) -> None:
    # Long-term memory (docs/memory.md): the DSN's one item of the Session's Secret, in the
    # custodian only; the harness's view of that Secret lists its two keys alone. Behind the
    # egress gateway the custodian forwards the database through a Unix socket in its own
    # state volume, which no other container mounts: on loopback, the tools container (same
    # network namespace) could reach the database without the proxy credential.
    added.volumes.append(
        {
            "name": "memory",
            "secret": {
                "secretName": wire_secret,
                "defaultMode": 0o440,
                "items": [{"key": MEMORY_DSN_KEY, "path": "dsn"}],
            },
        }
    )
    added.custodian_mounts.append(mount("memory", MEMORY_DIR, read_only=True))
    added.custodian_env.append(env("CORRAL_MEMORY_DSN_FILE", f"{MEMORY_DIR}/dsn"))
    if settings.egress_gateway is not None:
        added.custodian_env.append(env("CORRAL_MEMORY_SOCKET_DIR", MEMORY_SOCKET_DIR))


def _add_model_catalog(added: PodAdditions, configmap: str) -> None:
    # The platform's catalog overlay: the harness resolves models and the custodian
    # allowlists and clamps them from the same file (docs/model-catalog.md).
    added.volumes.append(
        {
            "name": "model-catalog",
            "configMap": {
                "name": configmap,
                "defaultMode": 0o444,
                "items": [{"key": MODEL_CATALOG_KEY, "path": MODEL_CATALOG_KEY}],
            },
        }
    )
    catalog_env = env("CORRAL_MODEL_CATALOG", f"{MODEL_CATALOG_DIR}/{MODEL_CATALOG_KEY}")
    catalog_mount = mount("model-catalog", MODEL_CATALOG_DIR, read_only=True)
    added.harness_env.append(catalog_env)
    added.custodian_env.append(dict(catalog_env))
    added.harness_mounts.append(catalog_mount)
    added.custodian_mounts.append(dict(catalog_mount))
