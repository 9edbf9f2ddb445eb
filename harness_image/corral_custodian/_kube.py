"""The custodian's way to the API server: corral_kube's client with the pod's projected
service-account token. The client re-reads the token file on every request (the kubelet
rotates it) and hands each new value to the redactor before it is sent; one the redactor
refuses (too short to redact) is never sent."""

from __future__ import annotations

from corral_kube import KubeClient, KubeConfig

from . import _secrets
from .settings import SERVICE_ACCOUNT_TOKEN, KubeSettings

CORRAL = "/apis/corral.dev/v1alpha1"


def _register(token: str) -> None:
    _secrets.register(SERVICE_ACCOUNT_TOKEN, token)  # SecretTooShort (a ValueError) refuses it


def kube_client(settings: KubeSettings) -> KubeClient:
    ca = settings.ca_file.read_bytes() if settings.ca_file is not None else None
    config = KubeConfig(
        server=settings.api, ca=ca, token_file=settings.token_file, on_token=_register
    )
    return KubeClient(config, timeout=15.0)


def corral_path(namespace: str, plural: str, name: str | None = None) -> str:
    base = f"{CORRAL}/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base
