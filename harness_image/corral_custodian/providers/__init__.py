"""Where the model proxy sends a checked request: the Agent's provider (docs/providers.md).

`build_provider` makes the one this custodian's settings name. Each provider is a small private
module: `_messages` (the Messages API and Messages-compatible gateways), `_bedrock` (Amazon
Bedrock, with `_sts` for its credentials and `_eventstream` for its framing), `_vertex` (Google
Vertex AI, with `_google_token` for the service-account key's JWT grant). The exception tree of
this boundary is drawn in `_base`.
"""

from __future__ import annotations

from ..settings import CustodianSettings
from ._base import (
    KEEP_RESPONSE,
    ModelRequest,
    PassThroughAnswer,
    Provider,
    ProviderRefusal,
    StreamBroken,
    UpstreamAnswer,
)
from ._messages import MessagesProvider

__all__ = [
    "KEEP_RESPONSE",
    "ModelRequest",
    "PassThroughAnswer",
    "Provider",
    "ProviderRefusal",
    "StreamBroken",
    "UpstreamAnswer",
    "build_provider",
]


def build_provider(settings: CustodianSettings) -> Provider:
    spec = settings.provider
    if spec.type == "bedrock":
        from ._bedrock import BedrockProvider

        return BedrockProvider(
            spec,
            credentials=settings.aws_credentials,
            web_identity_token_file=settings.aws_web_identity_token_file,
            session_name=f"corral-{settings.session_namespace}-{settings.session_name}",
        )
    if spec.type == "vertex":
        from ._vertex import VertexProvider

        return VertexProvider(spec, key_json=settings.gcp_key)
    return MessagesProvider(spec, settings.model_key)
