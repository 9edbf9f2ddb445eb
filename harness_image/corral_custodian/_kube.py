"""The custodian's way to the API server: corral_kube's client with the pod's projected
service-account token. The client re-reads the token file on every request (the kubelet
rotates it) and hands each new value to the redactor before it is sent; one the redactor
refuses (too short to redact) is never sent."""

from __future__ import annotations

from corral_api import corral_path as corral_path  # re-exported: the custodian's callers
from corral_kube import KubeClient, KubeConfig

from . import _secrets
from .settings import SERVICE_ACCOUNT_TOKEN, KubeSettings


def _register(token: str) -> None:
    _secrets.register(SERVICE_ACCOUNT_TOKEN, token)  # SecretTooShort (a ValueError) refuses it


def kube_client(settings: KubeSettings) -> KubeClient:
    ca = settings.ca_file.read_bytes() if settings.ca_file is not None else None
    config = KubeConfig(
        server=settings.api, ca=ca, token_file=settings.token_file, on_token=_register
    )
    return KubeClient(config, timeout=15.0)


