"""Where the API server is and who the caller is to it: a kubeconfig, or the pod's service
account. The TLS material is read once, here; a token file is re-read per request (the
client), because the kubelet rotates projected tokens."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ._errors import KubeConfigError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# Called with each new token value before it is sent; a ValueError refuses the token.
TokenCallback = Callable[[str], None]


@dataclass(frozen=True)
class ExecPlugin:
    """A kubeconfig user's `exec` credential plugin (an ExecCredential on its stdout)."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"


@dataclass(frozen=True)
class KubeConfig:
    """One API server and one identity. PEM material is held as bytes; `token_file` is read
    per request and each new value goes to `on_token` first."""

    server: str
    namespace: str = "default"
    ca: bytes | None = None  # PEM; None: the system's trust store
    insecure: bool = False  # insecure-skip-tls-verify
    client_cert: bytes | None = None  # PEM, with client_key
    client_key: bytes | None = None
    token: str | None = None
    token_file: Path | None = None
    exec_plugin: ExecPlugin | None = None
    on_token: TokenCallback | None = field(default=None, compare=False, repr=False)

    def ssl_context(self, *, client_cert: bool = True) -> ssl.SSLContext:
        """TLS to the API server; without `client_cert` for a client that presents someone
        else's token and must not authenticate as this identity too."""
        context = ssl.create_default_context(cadata=self.ca.decode() if self.ca else None)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if client_cert and self.client_cert and self.client_key:
            _load_cert_chain(context, self.client_cert, self.client_key)
        return context


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # The ssl module loads a chain from files only: they live for the call, in a 0700 dir.
    with tempfile.TemporaryDirectory(prefix="corral-kube-") as scratch:
        cert_path, key_path = Path(scratch, "client.crt"), Path(scratch, "client.key")
        for path, data in ((cert_path, cert), (key_path, key)):
            path.touch(mode=0o600)
            path.write_bytes(data)
        try:
            context.load_cert_chain(str(cert_path), str(key_path))
        except ssl.SSLError as e:
            raise KubeConfigError(f"the client certificate or key cannot be used: {e}") from e


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise KubeConfigError(f"the {what} {path} cannot be read: {e}") from e


# ------------------------------------------------------------------------------ in-cluster


def in_cluster_available(environ: Mapping[str, str] = os.environ) -> bool:
    return bool(environ.get("KUBERNETES_SERVICE_HOST") and environ.get("KUBERNETES_SERVICE_PORT"))


def in_cluster(
    *,
    on_token: TokenCallback | None = None,
    root: Path = SERVICE_ACCOUNT_DIR,
    environ: Mapping[str, str] = os.environ,
) -> KubeConfig:
    """The pod's own service account: the API server from KUBERNETES_SERVICE_HOST/PORT, the
    token file (re-read per request), the cluster's CA and the pod's namespace."""
    if not in_cluster_available(environ):
        raise KubeConfigError("not in a pod: KUBERNETES_SERVICE_HOST/PORT are unset")
    host, port = environ["KUBERNETES_SERVICE_HOST"], environ["KUBERNETES_SERVICE_PORT"]
    token_file = root / "token"
    if not token_file.is_file():
        raise KubeConfigError(f"no service-account token at {token_file}")
    namespace_file = root / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else "default"
    ca_file = root / "ca.crt"
    return KubeConfig(
        server=f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}",
        namespace=namespace or "default",
        ca=_read(ca_file, "cluster CA") if ca_file.is_file() else None,
        token_file=token_file,
        on_token=on_token,
    )


# ------------------------------------------------------------------------------ kubeconfig


@dataclass
class _Merged:
    """Named entries of one or more kubeconfig files: the first file to name one wins, and
    each entry's relative paths are relative to its own file."""

    current: str = ""
    clusters: dict[str, tuple[dict[str, Any], Path]] = field(default_factory=dict)
    users: dict[str, tuple[dict[str, Any], Path]] = field(default_factory=dict)
    contexts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, path: Path) -> None:
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise KubeConfigError(f"the kubeconfig {path} cannot be read: {e}") from e
        if not isinstance(loaded, dict):
            raise KubeConfigError(f"the kubeconfig {path} is not a mapping")
        self.current = self.current or str(loaded.get("current-context") or "")
        base = path.resolve().parent
        for entry in loaded.get("clusters") or []:
            self.clusters.setdefault(str(entry.get("name")), (entry.get("cluster") or {}, base))
        for entry in loaded.get("users") or []:
            self.users.setdefault(str(entry.get("name")), (entry.get("user") or {}, base))
        for entry in loaded.get("contexts") or []:
            self.contexts.setdefault(str(entry.get("name")), entry.get("context") or {})


def kubeconfig_paths(
    kubeconfig: str | os.PathLike[str] | None, environ: Mapping[str, str] = os.environ
) -> list[Path]:
    """The files to read: the one given, else $KUBECONFIG's list, else ~/.kube/config."""
    if kubeconfig is not None:
        return [Path(kubeconfig).expanduser()]
    listed = [Path(p).expanduser() for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [Path.home() / ".kube" / "config"]


def load_kubeconfig(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    context: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> KubeConfig:
    """The API server and identity of `context` (default: the current context) in the
    kubeconfig given, else in $KUBECONFIG's files (merged as kubectl merges them), else in
    ~/.kube/config."""
    paths = kubeconfig_paths(kubeconfig, environ)
    merged = _Merged()
    for path in paths:
        if kubeconfig is not None or path.exists():
            merged.add(path)
    name = context or merged.current
    if not name or name not in merged.contexts:
        where = ", ".join(str(p) for p in paths)
        raise KubeConfigError(f"no context {name or '(current-context unset)'!r} in {where}")
    chosen = merged.contexts[name]
    cluster_name, user_name = str(chosen.get("cluster")), str(chosen.get("user"))
    if cluster_name not in merged.clusters:
        raise KubeConfigError(f"context {name!r} names the unknown cluster {cluster_name!r}")
    cluster, cluster_base = merged.clusters[cluster_name]
    user, user_base = merged.users.get(user_name, ({}, Path.cwd()))
    if not cluster.get("server"):
        raise KubeConfigError(f"cluster {cluster_name!r} has no server")
    if user.get("auth-provider"):
        raise KubeConfigError(f"user {user_name!r}: auth-provider is not supported; use exec")
    for unsupported in ("tls-server-name", "proxy-url"):  # rather refused than half-honoured
        if cluster.get(unsupported):
            raise KubeConfigError(f"cluster {cluster_name!r}: {unsupported} is not supported")
    token_file = user.get("tokenFile")
    return KubeConfig(
        server=str(cluster["server"]).rstrip("/"),
        namespace=str(chosen.get("namespace") or "default"),
        ca=_material(cluster, "certificate-authority", cluster_base),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        client_cert=_material(user, "client-certificate", user_base),
        client_key=_material(user, "client-key", user_base),
        token=str(user["token"]) if user.get("token") else None,
        token_file=_relative(str(token_file), user_base) if token_file else None,
        exec_plugin=_exec_plugin(user.get("exec"), user_base),
    )


def _relative(text: str, base: Path) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else base / path


def _material(entry: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    """`key-data` (inline, base64) or `key` (a file, relative to its kubeconfig) as bytes."""
    inline = entry.get(f"{key}-data")
    if inline:
        try:
            return base64.b64decode(str(inline), validate=True)
        except ValueError as e:
            raise KubeConfigError(f"{key}-data is not base64: {e}") from e
    if entry.get(key):
        return _read(_relative(str(entry[key]), base), key)
    return None


def _exec_plugin(spec: Any, base: Path) -> ExecPlugin | None:
    if not spec:
        return None
    command = str(spec.get("command") or "")
    if not command:
        raise KubeConfigError("the user's exec plugin has no command")
    if os.sep in command:  # a path, as kubectl reads it: relative to the kubeconfig
        command = str(_relative(command, base))
    return ExecPlugin(
        command=command,
        args=tuple(str(a) for a in spec.get("args") or ()),
        env=tuple((str(e["name"]), str(e["value"])) for e in spec.get("env") or ()),
        api_version=str(spec.get("apiVersion") or ExecPlugin.api_version),
    )
