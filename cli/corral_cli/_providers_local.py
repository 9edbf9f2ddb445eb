"""A provider's credential for `corral run`'s custodian (docs/providers.md): read from this
shell's usual variables, handed to the custodian alone as files under the run's secrets
directory (never in the harness's or the tools' environment: `_processes.base_env` drops
them)."""

from __future__ import annotations

import os
from pathlib import Path

from corral_api.providers import ModelProvider

from ._localpaths import write_secret

# The variables a cloud credential is read from; no other part of the run sees them.
AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
CREDENTIAL_VARIABLES = (
    *AWS_VARIABLES,
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "GOOGLE_APPLICATION_CREDENTIALS",
)


def provider_env(provider: ModelProvider, secrets_dir: Path) -> dict[str, str]:
    """The custodian's variables for `provider`: its entry, and where its credential is."""
    env = {"CORRAL_MODEL_PROVIDER": provider.to_json()}
    if provider.type == "bedrock":
        found = {name: os.environ.get(name, "").strip() for name in AWS_VARIABLES}
        if found["AWS_ACCESS_KEY_ID"] or found["AWS_SECRET_ACCESS_KEY"]:
            directory = secrets_dir / "aws"
            for name, value in found.items():
                if value:
                    write_secret(directory / name.lower(), value)
            env["CORRAL_AWS_CREDENTIALS_DIR"] = str(directory)
        elif token_file := os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE", "").strip():
            env["CORRAL_AWS_WEB_IDENTITY_TOKEN_FILE"] = token_file
    key_file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS", "").strip()
    if provider.type == "vertex" and key_file:
        env["CORRAL_GCP_KEY_FILE"] = key_file
    return env
