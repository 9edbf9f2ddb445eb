"""The custodian's configuration, read from its environment (see `corral-custodian --help`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from corral_api.kinds import AgentSpec
from corral_api.providers import ModelProvider, ProviderError, implicit_provider, parse_provider
from corral_common import sigv4
from corral_common.memory import (
    LEXICAL,
    Embedder,
    EmbedderError,
    HashedLexicalEmbedder,
    embedder_named,
)

from . import _secrets
from .budget import Budget, Held, UsageTotals

DEFAULT_ADDR = "127.0.0.1:8081"
DEFAULT_UPSTREAM = "https://api.anthropic.com"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_IN_FLIGHT = 4
DEFAULT_MAX_BUNDLE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_BLOB_BYTES = 32 * 1024 * 1024

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class SettingsError(ValueError):
    """The environment does not describe a custodian that can start."""


@dataclass(frozen=True)
class KubeSettings:
    api: str
    token_file: Path
    ca_file: Path | None


@dataclass(frozen=True)
class CustodianSettings:
    host: str
    port: int
    # The operator's listener (GET /v1/usage only); None: not served.
    operator_host: str | None
    operator_port: int | None
    # The pod-local credential every caller but /readyz must present; None only when insecure.
    credential: str | None
    # The Session's wire token, which the operator presents on the operator port.
    wire_token: str | None
    upstream_url: str
    model_key: str | None
    session_name: str
    session_namespace: str
    session_uid: str
    budget: Budget  # the Session's, as the operator set it
    state_dir: Path | None
    agent_name: str | None
    agent_spec_file: Path | None
    agent_spec_json: str | None
    model_override: str | None  # the Session's overrides.model when there is no cluster
    kube: KubeSettings | None
    git_credentials_file: Path | None
    session_branch: str | None
    git_remote_url: str | None
    read_only: bool
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # A resumed Session's spending before its pod was lost: the record starts from it.
    usage_seed: UsageTotals | None = None
    # ...and what it had given its children (CORRAL_CARVED_SEED), counted against it too.
    carved_seed: Held | None = None
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    # The largest bundle of the agent's commits taken (CORRAL_MAX_BUNDLE_BYTES), and the
    # largest object in one (CORRAL_MAX_BLOB_BYTES); docs/delivery.md.
    max_bundle_bytes: int = DEFAULT_MAX_BUNDLE_BYTES
    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES
    # The long-term memory store (docs/memory.md): a SQLite file, or a PostgreSQL DSN read
    # from a secret file; neither: the Agent's memory is unavailable (recall is fail-open).
    memory_sqlite: Path | None = None
    memory_dsn: str | None = None
    # Behind the egress gateway, the directory of the Unix socket through which the custodian
    # forwards the PostgreSQL store (_pgforward.py): its own, never the tools container's.
    # Unset: `memory-socket` under the state directory, else a private temporary one.
    memory_socket_dir: Path | None = None
    # CORRAL_MEMORY_EMBEDDER: how recall compares text (lexical, or a model from the
    # `memory-embeddings` extra); loaded here so a bad name or a missing extra stops the start.
    memory_embedder: Embedder = field(default_factory=HashedLexicalEmbedder)
    # The Agent's credentials.hookSecretRef, one file per key: http hooks' secret headers.
    hook_secret_dir: Path | None = None
    # No cluster, but a session tree of `corral run` (corral_common.session_files): children
    # are created and read there.
    local_sessions_dir: Path | None = None
    # The egress gateway (docs/egress.md): its proxy URL, and this Session's proxy credential
    # (CORRAL_EGRESS_CREDENTIAL_FILE), which makes the custodian's requests the custodian's.
    egress_proxy: str | None = None
    egress_credential: str | None = field(default=None, repr=False)
    # The trace collector's traces URL, where the harness's OTLP exports are relayed
    # (_otlp.py): CORRAL_OTLP_TRACES_ENDPOINT as is, else CORRAL_OTLP_ENDPOINT + /v1/traces.
    otlp_traces_url: str | None = None
    # Where model requests go (docs/providers.md): CORRAL_MODEL_PROVIDER (the platform's
    # entry, as JSON), else the Messages API at CORRAL_UPSTREAM_URL. Its credentials: the
    # model key above (anthropic, gateway); AWS keys (CORRAL_AWS_CREDENTIALS_DIR, else the
    # AWS_* variables) or the web identity token (bedrock); a service-account key (vertex).
    provider: ModelProvider = field(default_factory=lambda: implicit_provider(DEFAULT_UPSTREAM))
    aws_credentials: sigv4.Credentials | None = field(default=None, repr=False)
    aws_web_identity_token_file: Path | None = None
    gcp_key: str | None = field(default=None, repr=False)

    def load_agent(self) -> AgentSpec:
        """The Agent spec without a cluster, read afresh each call (a mounted file may change)."""
        if self.agent_spec_file is not None:
            try:
                text = self.agent_spec_file.read_text()
            except OSError as e:
                raise SettingsError(f"cannot read CORRAL_AGENT_SPEC_FILE: {e}") from e
            return parse_agent_spec(text, "CORRAL_AGENT_SPEC_FILE")
        if self.agent_spec_json is not None:
            return parse_agent_spec(self.agent_spec_json, "CORRAL_AGENT_SPEC_JSON")
        raise SettingsError(
            "no Agent: set CORRAL_AGENT_SPEC_JSON or CORRAL_AGENT_SPEC_FILE, or configure the "
            "cluster (CORRAL_KUBE_API) so the Agent is read from it"
        )


def parse_agent_spec(text: str, source: str) -> AgentSpec:
    try:
        data: Any = json.loads(text)
    except ValueError:
        # Only a hand-written file is YAML; pods and `corral run` pass JSON, so the YAML parser
        # is not imported on the custodian's start path.
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise SettingsError(f"{source} is not JSON or YAML: {e}") from e
    if isinstance(data, dict) and data.get("kind") == "Agent":
        data = data.get("spec")
    if not isinstance(data, dict):
        raise SettingsError(f"{source} must hold an Agent spec object")
    try:
        return AgentSpec.model_validate(data)
    except ValueError as e:
        raise SettingsError(f"{source} is not a valid Agent spec: {e}") from e


def _split_addr(addr: str, name: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SettingsError(f"{name} must be host:port, not {addr!r}")
    return host.strip("[]"), int(port)


_SEED_FIELDS = {"input": "input", "output": "output", "cacheRead": "cache_read",
                "cacheWrite": "cache_write"}  # fmt: skip


def _usage_seed(env: Mapping[str, str], name: str) -> UsageTotals | None:
    """What a resumed Session had spent (the operator's JSON of its status.usage)."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        data = json.loads(raw)
        counts = {mine: int(data.get(theirs) or 0) for theirs, mine in _SEED_FIELDS.items()}
        seed = UsageTotals(
            input=counts["input"],
            output=counts["output"],
            cache_read=counts["cache_read"],
            cache_write=counts["cache_write"],
            cost=float(data.get("cost") or 0.0),
        )
    except (ValueError, TypeError, AttributeError) as e:
        raise SettingsError(f"{name} must be a JSON object of token counts and a cost: {e}") from e
    if min(seed.input, seed.output, seed.cache_read, seed.cache_write, seed.cost) < 0:
        raise SettingsError(f"{name} cannot be negative")
    return seed


def _carved_seed(env: Mapping[str, str], name: str) -> Held | None:
    """What a resumed Session's lost custodian had given its children (the operator's JSON:
    the sum of their spec.budget), which the new one counts from the start."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        data = json.loads(raw)
        carved = Held(int(data.get("tokens") or 0), float(data.get("cost") or 0.0))
    except (ValueError, TypeError, AttributeError) as e:
        raise SettingsError(f"{name} must be a JSON object with tokens and a cost: {e}") from e
    if carved.tokens < 0 or carved.cost < 0:
        raise SettingsError(f"{name} cannot be negative")
    return carved


def _number(env: Mapping[str, str], name: str, kind: type[int] | type[float]) -> Any:
    raw = env.get(name, "").strip()
    if not raw:
        return kind(0)
    try:
        value = kind(raw)
    except ValueError as e:
        raise SettingsError(f"{name} must be a number, not {raw!r}") from e
    if value < 0:
        raise SettingsError(f"{name} cannot be negative")
    return value


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    value = _number(env, name, int)
    if name in env and env[name].strip() and value < 1:
        raise SettingsError(f"{name} must be at least 1")
    return int(value) or default


def _path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name, "").strip()
    return Path(raw) if raw else None


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes")


def _secret(env: Mapping[str, str], name: str) -> str | None:
    """The text of a secret file named by `name`; an unreadable or empty file is an error."""
    path = _path(env, name)
    if path is None:
        return None
    try:
        text = path.read_text().strip()
    except OSError as e:
        raise SettingsError(f"cannot read {name}: {e}") from e
    if not text:
        raise SettingsError(f"{name} ({path}) is empty")
    return text


def _embedder(env: Mapping[str, str], name: str) -> Embedder:
    try:
        return embedder_named(env.get(name, "").strip() or LEXICAL)
    except EmbedderError as e:
        raise SettingsError(f"{name}: {e}") from e


def _model_key(env: Mapping[str, str]) -> str | None:
    return env.get("ANTHROPIC_API_KEY") or _secret(env, "CORRAL_MODEL_KEY_FILE")


def _provider(env: Mapping[str, str], upstream_url: str) -> ModelProvider:
    text = env.get("CORRAL_MODEL_PROVIDER", "").strip()
    if not text:
        return implicit_provider(upstream_url)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SettingsError(f"CORRAL_MODEL_PROVIDER is not JSON: {e.msg}") from e
    try:
        return parse_provider(data, "CORRAL_MODEL_PROVIDER")
    except ProviderError as e:
        raise SettingsError(str(e)) from e


# The keys of an AWS credentials Secret (awsSecretRef), as files, and their variables.
AWS_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


def _aws_credentials(env: Mapping[str, str]) -> sigv4.Credentials | None:
    """From the Secret's files (CORRAL_AWS_CREDENTIALS_DIR), else from AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN (`corral run`); both keys or neither."""
    found: dict[str, str] = {}
    directory = _path(env, "CORRAL_AWS_CREDENTIALS_DIR")
    for key in AWS_KEYS:
        if directory is not None:
            try:
                value = (directory / key).read_text().strip()
            except FileNotFoundError:
                value = ""
            except OSError as e:
                raise SettingsError(f"cannot read {key} in CORRAL_AWS_CREDENTIALS_DIR: {e}") from e
        else:
            value = env.get(key.upper(), "").strip()
        if value:
            found[key] = value
    if not found:
        return None
    where = "CORRAL_AWS_CREDENTIALS_DIR" if directory is not None else "the AWS_* variables"
    for key in AWS_KEYS[:2]:
        if key not in found:
            raise SettingsError(f"{where}: {key} is missing (an AWS key needs both halves)")
    return sigv4.Credentials(
        found["aws_access_key_id"], found["aws_secret_access_key"], found.get("aws_session_token")
    )


def _gcp_key(env: Mapping[str, str]) -> str | None:
    name = "CORRAL_GCP_KEY_FILE" if env.get("CORRAL_GCP_KEY_FILE") else (
        "GOOGLE_APPLICATION_CREDENTIALS")  # fmt: skip
    return _secret(env, name)


def _otlp_traces_url(env: Mapping[str, str]) -> str | None:
    """OpenTelemetry's rule: the signal's variable is the URL, the general one a base to which
    `/v1/traces` is appended."""
    name, url = "CORRAL_OTLP_TRACES_ENDPOINT", env.get("CORRAL_OTLP_TRACES_ENDPOINT", "").strip()
    if not url:
        name, base = "CORRAL_OTLP_ENDPOINT", env.get("CORRAL_OTLP_ENDPOINT", "").strip()
        if not base:
            return None
        url = base.rstrip("/") + "/v1/traces"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"{name} must be an http:// or https:// URL, not {url!r}")
    return url


def from_env(env: Mapping[str, str]) -> CustodianSettings:
    addr = env.get("CORRAL_CUSTODIAN_ADDR", DEFAULT_ADDR)
    host, port = _split_addr(addr, "CORRAL_CUSTODIAN_ADDR")
    credential = _secret(env, "CORRAL_CUSTODIAN_CREDENTIAL_FILE")
    if credential is None and not _flag(env, "CORRAL_CUSTODIAN_INSECURE"):
        raise SettingsError(
            "CORRAL_CUSTODIAN_CREDENTIAL_FILE is not set, so anyone could call this custodian; "
            "set it (the harness presents the same credential), or set CORRAL_CUSTODIAN_INSECURE=1"
            " to run without caller authentication on a trusted machine"
        )
    operator_host: str | None = None
    operator_port: int | None = None
    wire_token = _secret(env, "CORRAL_WIRE_TOKEN_FILE")
    operator_addr = env.get("CORRAL_CUSTODIAN_OPERATOR_ADDR", "").strip()
    if operator_addr:
        operator_host, operator_port = _split_addr(operator_addr, "CORRAL_CUSTODIAN_OPERATOR_ADDR")
        if wire_token is None:
            raise SettingsError(
                "CORRAL_CUSTODIAN_OPERATOR_ADDR is set but CORRAL_WIRE_TOKEN_FILE is not: the "
                "operator port answers only the wire token"
            )
        if (operator_host, operator_port) == (host, port):
            raise SettingsError("the operator port must differ from CORRAL_CUSTODIAN_ADDR")

    key = _model_key(env)
    kube: KubeSettings | None = None
    api = env.get("CORRAL_KUBE_API", "").strip()
    if api:
        token_file = _path(env, "CORRAL_KUBE_TOKEN_FILE")
        if token_file is None:
            raise SettingsError("CORRAL_KUBE_API is set but CORRAL_KUBE_TOKEN_FILE is not")
        kube = KubeSettings(api.rstrip("/"), token_file, _path(env, "CORRAL_KUBE_CA_FILE"))

    session_name = env.get("CORRAL_SESSION_NAME", "local")
    namespace = env.get("CORRAL_SESSION_NAMESPACE", "default")
    # Both end up in API paths: nothing but object names may get there.
    if not _OBJECT_NAME.match(session_name) or ".." in session_name:
        raise SettingsError(f"CORRAL_SESSION_NAME {session_name!r} is not an object name")
    if not _DNS_LABEL.match(namespace):
        raise SettingsError(f"CORRAL_SESSION_NAMESPACE {namespace!r} is not a namespace name")
    agent_name = env.get("CORRAL_AGENT_NAME", "").strip() or None
    if agent_name is not None and not _DNS_LABEL.match(agent_name):
        raise SettingsError(f"CORRAL_AGENT_NAME {agent_name!r} is not an Agent name")

    settings = CustodianSettings(
        host=host,
        port=port,
        operator_host=operator_host,
        operator_port=operator_port,
        credential=credential,
        wire_token=wire_token,
        upstream_url=env.get("CORRAL_UPSTREAM_URL", DEFAULT_UPSTREAM).rstrip("/"),
        model_key=key,
        session_name=session_name,
        session_namespace=namespace,
        session_uid=env.get("CORRAL_SESSION_UID", ""),
        # 0 or unset: the operator set no cap on that axis.
        budget=Budget(
            tokens=_number(env, "CORRAL_BUDGET_TOKENS", int) or None,
            cost=_number(env, "CORRAL_BUDGET_COST", float) or None,
        ),
        state_dir=_path(env, "CORRAL_STATE_DIR"),
        usage_seed=_usage_seed(env, "CORRAL_USAGE_SEED"),
        carved_seed=_carved_seed(env, "CORRAL_CARVED_SEED"),
        agent_name=agent_name,
        agent_spec_file=_path(env, "CORRAL_AGENT_SPEC_FILE"),
        agent_spec_json=env.get("CORRAL_AGENT_SPEC_JSON") or None,
        model_override=env.get("CORRAL_MODEL_OVERRIDE", "").strip() or None,
        kube=kube,
        git_credentials_file=_path(env, "CORRAL_GIT_CREDENTIALS_FILE"),
        session_branch=env.get("CORRAL_SESSION_BRANCH", "").strip() or None,
        git_remote_url=env.get("CORRAL_GIT_REMOTE_URL", "").strip() or None,
        read_only=_flag(env, "CORRAL_READ_ONLY"),
        max_body_bytes=_positive(env, "CORRAL_MAX_REQUEST_BYTES", DEFAULT_MAX_BODY_BYTES),
        max_in_flight=_positive(env, "CORRAL_MAX_MODEL_REQUESTS", DEFAULT_MAX_IN_FLIGHT),
        max_bundle_bytes=_positive(env, "CORRAL_MAX_BUNDLE_BYTES", DEFAULT_MAX_BUNDLE_BYTES),
        max_blob_bytes=_positive(env, "CORRAL_MAX_BLOB_BYTES", DEFAULT_MAX_BLOB_BYTES),
        memory_sqlite=_path(env, "CORRAL_MEMORY_SQLITE"),
        memory_dsn=_secret(env, "CORRAL_MEMORY_DSN_FILE"),
        memory_socket_dir=_path(env, "CORRAL_MEMORY_SOCKET_DIR"),
        memory_embedder=_embedder(env, "CORRAL_MEMORY_EMBEDDER"),
        hook_secret_dir=_path(env, "CORRAL_HOOK_SECRET_DIR"),
        local_sessions_dir=_path(env, "CORRAL_LOCAL_SESSIONS_DIR"),
        egress_proxy=env.get("CORRAL_EGRESS_PROXY", "").strip() or None,
        egress_credential=_secret(env, "CORRAL_EGRESS_CREDENTIAL_FILE"),
        otlp_traces_url=_otlp_traces_url(env),
        provider=_provider(env, env.get("CORRAL_UPSTREAM_URL", DEFAULT_UPSTREAM).rstrip("/")),
        aws_credentials=_aws_credentials(env),
        aws_web_identity_token_file=_path(env, "CORRAL_AWS_WEB_IDENTITY_TOKEN_FILE"),
        gcp_key=_gcp_key(env),
    )
    if (settings.egress_proxy is None) != (settings.egress_credential is None):
        raise SettingsError(
            "set both CORRAL_EGRESS_PROXY and CORRAL_EGRESS_CREDENTIAL_FILE, or neither"
        )
    if settings.memory_sqlite is not None and settings.memory_dsn is not None:
        raise SettingsError("set CORRAL_MEMORY_SQLITE or CORRAL_MEMORY_DSN_FILE, not both")
    if kube is None:
        settings.load_agent()  # fail at start, not at the first turn, on a bad or missing spec
    elif not settings.session_uid:
        raise SettingsError("CORRAL_SESSION_UID is required when a cluster is configured")
    return settings


# --- the credentials this custodian holds, registered with the redactor ------------------------

# Marker names: `[redacted:<name>]` is what a text shows in place of the value.
# The user name of the proxy credential (the gateway reads the password alone).
EGRESS_PROXY_USER = "custodian"
MODEL_KEY = "model-key"
CUSTODIAN_CREDENTIAL = "custodian-credential"
WIRE_TOKEN = "wire-token"
GIT_CREDENTIAL = "git-credential"
MEMORY_DSN = "memory-dsn"
MEMORY_PASSWORD = "memory-password"
HOOK_SECRET = "hook-secret"
SERVICE_ACCOUNT_TOKEN = "service-account-token"
EGRESS_CREDENTIAL = "egress-credential"
AWS_SECRET_KEY = "aws-secret-key"
AWS_SESSION_TOKEN = "aws-session-token"
AWS_WEB_IDENTITY_TOKEN = "aws-web-identity-token"
GCP_PRIVATE_KEY = "gcp-private-key"
# Credentials a provider mints while it runs (STS session keys, Google access tokens): each
# is registered when it is minted (providers/).
MINTED_CREDENTIAL = "minted-credential"

_MODEL_KEY_SOURCE = "the model key (ANTHROPIC_API_KEY or CORRAL_MODEL_KEY_FILE)"

_LIBPQ_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")


def register_credentials(settings: CustodianSettings) -> None:
    """Register every credential `settings` names with the redactor, at start. A credential
    too short to redact stops the start with a SettingsError naming it (never its value).
    The service-account token and hook secrets are registered again whenever a later read
    finds a new value (_kube.py, _hooks.py): they rotate."""
    _register(MODEL_KEY, settings.model_key, _MODEL_KEY_SOURCE)
    _register(CUSTODIAN_CREDENTIAL, settings.credential, "CORRAL_CUSTODIAN_CREDENTIAL_FILE")
    _register(WIRE_TOKEN, settings.wire_token, "CORRAL_WIRE_TOKEN_FILE")
    if settings.git_credentials_file is not None:
        register_git_credentials(settings.git_credentials_file)
    if settings.memory_dsn is not None:
        register_dsn(settings.memory_dsn)
    if settings.hook_secret_dir is not None:
        register_hook_secrets(settings.hook_secret_dir)
    if settings.egress_credential is not None:
        # Alone, and as the proxy URL and the Proxy-Authorization header carry it.
        _register_basic(
            EGRESS_CREDENTIAL,
            EGRESS_PROXY_USER,
            settings.egress_credential,
            "CORRAL_EGRESS_CREDENTIAL_FILE",
        )
    register_provider_credentials(settings)
    if settings.kube is not None:
        try:
            token = settings.kube.token_file.read_text()
        except OSError:
            token = None  # the first API call reports it; nothing to redact yet
        _register(SERVICE_ACCOUNT_TOKEN, token, "CORRAL_KUBE_TOKEN_FILE")


def register_provider_credentials(settings: CustodianSettings) -> None:
    """The cloud providers' credentials (docs/providers.md); the web identity token is read
    again, and registered again, whenever the provider reads a rotated one."""
    if settings.aws_credentials is not None:
        _register(AWS_SECRET_KEY, settings.aws_credentials.secret_access_key, "the AWS key")
        _register(AWS_SESSION_TOKEN, settings.aws_credentials.session_token, "the AWS key")
    if settings.aws_web_identity_token_file is not None:
        try:
            token = settings.aws_web_identity_token_file.read_text().strip()
        except OSError:
            token = None  # the first exchange reports it
        _register(AWS_WEB_IDENTITY_TOKEN, token or None, "CORRAL_AWS_WEB_IDENTITY_TOKEN_FILE")
    if settings.gcp_key is not None:
        _register(GCP_PRIVATE_KEY, settings.gcp_key, "the Google service-account key")
        try:
            key = json.loads(settings.gcp_key)
        except json.JSONDecodeError:
            key = None  # the provider says what is wrong with it at its first request
        if isinstance(key, dict) and isinstance(key.get("private_key"), str):
            _register(GCP_PRIVATE_KEY, key["private_key"], "the Google service-account key")
            for line in key["private_key"].splitlines():
                if len(line) >= 32 and not line.startswith("-----"):
                    _secrets.register(GCP_PRIVATE_KEY, line)  # a PEM line seen alone


def register_minted(value: str) -> None:
    """A credential a provider has just minted; redacted from then on."""
    _secrets.register(MINTED_CREDENTIAL, value)


def register_model_key(env: Mapping[str, str]) -> None:
    """A pooled custodian holds the Agent's model key before it is adopted: registered then."""
    _register(MODEL_KEY, _model_key(env), _MODEL_KEY_SOURCE)


def _register(name: str, value: str | None, source: str) -> None:
    try:
        _secrets.register(name, value)
    except _secrets.SecretTooShort as e:
        raise SettingsError(f"{source} cannot be used: {e}") from None


def _register_basic(name: str, user: str, password: str, source: str) -> None:
    try:
        _secrets.register_basic(name, user, password)
    except _secrets.SecretTooShort as e:
        raise SettingsError(f"{source} cannot be used: {e}") from None


def register_git_credentials(path: Path) -> None:
    """Each `https://user:token@host` line of a git credential-store file: the token, and the
    `user:token` pair (as in the URL, and as the HTTP Basic header carries it). A file that
    cannot be read registers nothing: git cannot use it either."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            url = urlsplit(line)
            user, password = url.username, url.password
        except ValueError:
            continue  # not a URL: git skips the line too
        if password:
            source = f"line {number} of CORRAL_GIT_CREDENTIALS_FILE"
            _register_basic(GIT_CREDENTIAL, unquote(user or ""), unquote(password), source)


def register_dsn(dsn: str) -> None:
    """The memory DSN whole, and its password (URL form, its `?password=`, or libpq's
    `password=...`), with the login pair as in the URL."""
    _register(MEMORY_DSN, dsn, "CORRAL_MEMORY_DSN_FILE")
    source = "the password in CORRAL_MEMORY_DSN_FILE"
    if "://" in dsn:
        try:
            url = urlsplit(dsn)
            user, password = url.username, url.password
        except ValueError:
            return
        if password:
            _register_basic(MEMORY_PASSWORD, unquote(user or ""), unquote(password), source)
        for value in parse_qs(url.query).get("password", []):
            _register(MEMORY_PASSWORD, value, source)
        return
    for match in _LIBPQ_PASSWORD.finditer(dsn):
        value = match.group(1)
        if value.startswith("'") and value.endswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        _register(MEMORY_PASSWORD, value, source)


def register_hook_secrets(directory: Path) -> None:
    """Every key of the mounted credentials.hookSecretRef (a Secret volume's `..data` links
    and timestamped directories are not keys)."""
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return  # a hook that needs it reports it
    for entry in entries:
        if entry.name.startswith(".."):
            continue
        try:
            value = entry.read_text() if entry.is_file() else None
        except (OSError, UnicodeDecodeError):
            continue
        register_hook_secret(entry.name, value)


def register_hook_secret(key: str, value: str | None) -> None:
    _register(HOOK_SECRET, value, f"key {key!r} of CORRAL_HOOK_SECRET_DIR")
