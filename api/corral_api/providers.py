"""Model providers: where the custodian sends an Agent's model requests (docs/providers.md).

The platform defines them (the chart's `modelProviders`, the operator's
`--model-providers-file`, `corral run --providers`), and an Agent names one in `spec.provider`
as a Pod names a RuntimeClass: an Agent's author never chooses where a credential goes. Every
provider is reached by the custodian alone; the harness speaks the Messages API to the custodian
whatever the provider, and the custodian translates.

- `anthropic`: the Messages API at `baseUrl` with `x-api-key` (the Agent's `modelSecretRef`).
- `gateway`: a Messages-compatible gateway at `baseUrl`; the key goes in `authHeader` (with
  `authScheme` before it, e.g. `Bearer`).
- `bedrock`: Amazon Bedrock's `InvokeModelWithResponseStream` in `region`, signed with SigV4;
  credentials from the Agent's `awsSecretRef` or the cluster's web identity (`webIdentity`),
  optionally chained into `roleArn`.
- `vertex`: Google Vertex AI's `streamRawPredict` in `project` and `region`, with a token from
  the Agent's `gcpSecretRef` (a service-account key) exchanged by a signed JWT grant at
  `tokenUrl`.

The endpoint fields (`endpointUrl`, `stsUrl`, `tokenUrl`) default to the public endpoints of
the region; a platform sets them for a VPC endpoint, and the tests for their stand-ins. Pure data
and validation; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

ProviderType = Literal["anthropic", "bedrock", "vertex", "gateway"]
# The provider an install has when it names none: the Messages API at the operator's
# `--model-upstream-url` (the chart's `sandbox.modelUpstreamUrl`).
IMPLICIT_PROVIDER = "anthropic"
DEFAULT_ANTHROPIC_URL = "https://api.anthropic.com"
DEFAULT_GOOGLE_TOKEN_URL = "https://oauth2.googleapis.com/token"
# The audience of the projected service-account token Bedrock's web identity exchanges.
STS_AUDIENCE = "sts.amazonaws.com"
# The body's `anthropic_version` each cloud wants instead of the header.
BEDROCK_ANTHROPIC_VERSION = "bedrock-2023-05-31"
VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16"

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_REGION = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_HEADER = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$"
_ROLE_ARN = r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]+$"
_GCP_PROJECT = r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$"
# Headers a gateway's key may not be put in: they carry something else the custodian writes.
_RESERVED_HEADERS = frozenset(
    {"host", "content-type", "content-length", "anthropic-version", "anthropic-beta",
     "accept-encoding", "transfer-encoding", "connection", "proxy-authorization"}
)  # fmt: skip


class ProviderError(ValueError):
    """A provider list (or an Agent's choice in it) that cannot be used; the message says why."""


def _url(value: str | None, field: str) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{field} must be an http:// or https:// URL, not {value!r}")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(f"{field} must not carry a user, a query or a fragment")
    return value.rstrip("/")


class ModelProvider(BaseModel):
    """One entry of the platform's `modelProviders`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    name: str = Field(pattern=_DNS_LABEL, max_length=63, description="What Agents name.")
    type: ProviderType = Field(description="anthropic, bedrock, vertex or gateway.")
    default: bool = Field(default=False, description="Used by Agents that name no provider.")
    base_url: str | None = Field(
        default=None, alias="baseUrl", description="anthropic and gateway: the Messages API."
    )
    auth_header: str = Field(
        default="x-api-key",
        alias="authHeader",
        pattern=_HEADER,
        description="gateway: the header the key goes in.",
    )
    auth_scheme: str | None = Field(
        default=None,
        alias="authScheme",
        pattern=r"^[A-Za-z][A-Za-z0-9._-]{0,31}$",
        description="gateway: a word before the key in authHeader, e.g. Bearer.",
    )
    region: str | None = Field(
        default=None, pattern=_REGION, max_length=32, description="bedrock and vertex."
    )
    role_arn: str | None = Field(
        default=None,
        alias="roleArn",
        pattern=_ROLE_ARN,
        max_length=2048,
        description="bedrock: the role assumed (from the Agent's keys, or the web identity).",
    )
    web_identity: bool = Field(
        default=False,
        alias="webIdentity",
        description="bedrock: an Agent without awsSecretRef assumes roleArn with the pod's "
        "projected token (audience sts.amazonaws.com), in the custodian only.",
    )
    cross_region: bool = Field(
        default=True,
        alias="crossRegion",
        description="bedrock: use the region's cross-region inference profile (us., eu., "
        "apac. before the catalog's model id).",
    )
    project: str | None = Field(
        default=None, pattern=_GCP_PROJECT, description="vertex: the Google Cloud project."
    )
    endpoint_url: str | None = Field(
        default=None,
        alias="endpointUrl",
        description="bedrock and vertex: the runtime endpoint (default: the region's public "
        "one; a VPC endpoint otherwise).",
    )
    sts_url: str | None = Field(
        default=None, alias="stsUrl", description="bedrock: STS (default: the region's)."
    )
    token_url: str | None = Field(
        default=None,
        alias="tokenUrl",
        description="vertex: the OAuth token endpoint (default Google's). A key's own "
        "token_uri is never used: the platform, not the key, says where it is sent.",
    )

    @model_validator(mode="after")
    def _fits_its_type(self) -> ModelProvider:
        for field in ("base_url", "endpoint_url", "sts_url", "token_url"):
            _url(getattr(self, field), field)
        needs: dict[str, tuple[str, ...]] = {
            "gateway": ("base_url",),
            "bedrock": ("region",),
            "vertex": ("project", "region"),
            "anthropic": (),
        }
        for field in needs[self.type]:
            if getattr(self, field) is None:
                raise ValueError(f"a {self.type} provider needs {_alias(field)}")
        allowed: dict[str, set[str]] = {
            "anthropic": {"base_url"},
            "gateway": {"base_url", "auth_header", "auth_scheme"},
            "bedrock": {
                "region",
                "role_arn",
                "web_identity",
                "cross_region",
                "endpoint_url",
                "sts_url",
            },
            "vertex": {"project", "region", "endpoint_url", "token_url"},
        }
        typed = {"base_url", "auth_header", "auth_scheme", "region", "role_arn",
                 "web_identity", "cross_region", "project", "endpoint_url", "sts_url",
                 "token_url"}  # fmt: skip
        for field in sorted(typed - allowed[self.type]):
            if field in self.model_fields_set:
                raise ValueError(f"{_alias(field)} is not a field of a {self.type} provider")
        if self.type == "bedrock" and self.web_identity and self.role_arn is None:
            raise ValueError("webIdentity needs roleArn: the role the pod's token assumes")
        if self.auth_header.lower() in _RESERVED_HEADERS:
            raise ValueError(f"authHeader {self.auth_header!r} carries something else")
        return self

    # ------------------------------------------------------------------ where requests go

    def messages_base(self) -> str:
        """anthropic and gateway: the base URL `/v1/messages` is appended to."""
        return self.base_url or DEFAULT_ANTHROPIC_URL

    def bedrock_endpoint(self) -> str:
        return self.endpoint_url or f"https://bedrock-runtime.{self.region}.amazonaws.com"

    def sts_endpoint(self) -> str:
        return self.sts_url or f"https://sts.{self.region}.amazonaws.com"

    def vertex_endpoint(self) -> str:
        if self.endpoint_url:
            return self.endpoint_url
        if self.region == "global":
            return "https://aiplatform.googleapis.com"
        return f"https://{self.region}-aiplatform.googleapis.com"

    def google_token_endpoint(self) -> str:
        return self.token_url or DEFAULT_GOOGLE_TOKEN_URL

    def destinations(self) -> list[str]:
        """The URLs the custodian reaches for this provider: its credentialed destinations."""
        if self.type in ("anthropic", "gateway"):
            return [self.messages_base()]
        if self.type == "bedrock":
            out = [self.bedrock_endpoint()]
            if self.role_arn is not None:
                out.append(self.sts_endpoint())
            return out
        return [self.google_token_endpoint(), self.vertex_endpoint()]

    def inference_prefix(self) -> str:
        """bedrock: the cross-region inference profile's geography for the region, or ''."""
        if self.type != "bedrock" or not self.cross_region or self.region is None:
            return ""
        for start, geography in (("us-gov-", "us-gov"), ("us-", "us"), ("ca-", "us"),
                                 ("eu-", "eu"), ("ap-", "apac")):  # fmt: skip
            if self.region.startswith(start):
                return geography
        return ""

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_defaults=True)


def _alias(field: str) -> str:
    info = ModelProvider.model_fields[field]
    return info.alias or field


def _message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def parse_provider(data: object, where: str = "provider") -> ModelProvider:
    try:
        return ModelProvider.model_validate(data)
    except ValidationError as exc:
        raise ProviderError(f"{where}: {_message(exc)}") from exc


def parse_providers(data: object, where: str = "modelProviders") -> list[ModelProvider]:
    """The platform's list, each entry valid, names unique, at most one default."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise ProviderError(f"{where} must be a list of providers")
    out = [parse_provider(item, f"{where}[{i}]") for i, item in enumerate(data)]
    names = [p.name for p in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ProviderError(f"{where}: provider {twice[0]!r} is defined twice")
    defaults = [p.name for p in out if p.default]
    if len(defaults) > 1:
        raise ProviderError(f"{where}: only one provider may be the default, not {defaults}")
    return out


def load_providers(text: str, where: str) -> list[ModelProvider]:
    """A providers file's contents: JSON or YAML, a list or `{modelProviders: [...]}`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ProviderError(f"{where}: neither JSON nor YAML: {exc}") from exc
    if isinstance(data, dict) and "modelProviders" in data:
        data = data["modelProviders"]
    return parse_providers(data, where)


def implicit_provider(upstream_url: str) -> ModelProvider:
    return ModelProvider(name=IMPLICIT_PROVIDER, type="anthropic", base_url=upstream_url)


def choose_provider(
    providers: Sequence[ModelProvider], wanted: str | None, upstream_url: str
) -> ModelProvider:
    """The provider an Agent that names `wanted` (or none) uses; `ProviderError` when it names
    one the platform has not defined. With no list, the one implicit `anthropic` provider."""
    if not providers:
        implicit = implicit_provider(upstream_url)
        if wanted in (None, IMPLICIT_PROVIDER):
            return implicit
        raise ProviderError(
            f"the Agent names provider {wanted!r}, but this installation defines no "
            "modelProviders (only the implicit 'anthropic')"
        )
    if wanted is None:
        chosen = [p for p in providers if p.default] or [providers[0]]
        return chosen[0]
    for provider in providers:
        if provider.name == wanted:
            return provider
    known = ", ".join(sorted(p.name for p in providers))
    raise ProviderError(
        f"the Agent names provider {wanted!r}, which is not defined (known: {known})"
    )

