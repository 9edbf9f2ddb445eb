"""The one exception tree of every Kubernetes call (drawn in the package's docstring)."""

from __future__ import annotations


class KubeError(Exception):
    """Any failure of a call to the API server; `message` says what happened."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class KubeConfigError(KubeError):
    """No usable way to the API server: the kubeconfig, a token file or an exec plugin."""


class KubeUnreachable(KubeError):
    """The API server could not be reached or did not answer: connect, TLS, timeout, a
    stream cut short."""


class KubeRefused(KubeError):
    """The API server answered with an error status; `reason` is its Status reason
    (`NotFound`, `AlreadyExists`, ...) when it gave one."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    def __str__(self) -> str:
        reason = f" {self.reason}" if self.reason else ""
        return f"{self.status}{reason}: {self.message}"


class Unauthorized(KubeRefused):
    """401: the credentials were not accepted."""


class Forbidden(KubeRefused):
    """403: RBAC (or admission) does not allow it."""


class NotFound(KubeRefused):
    """404: no such object (or path)."""


class Conflict(KubeRefused):
    """409: it exists already, or it changed since the resourceVersion given."""


class Gone(KubeRefused):
    """410: a watch's or a list's resourceVersion expired: list again."""


_BY_STATUS: dict[int, type[KubeRefused]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
}


def refused(status: int, message: str, reason: str = "") -> KubeRefused:
    """The refusal of `status`, as its own class when callers tell it apart."""
    return _BY_STATUS.get(status, KubeRefused)(status, message, reason)
