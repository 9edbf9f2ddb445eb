"""Where corral_kube finds the API server and the identity: kubeconfig files (inline `-data`
and file references relative to their kubeconfig, current-context, $KUBECONFIG's merge as
kubectl does it) and the pod's service account."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral_kube import ExecPlugin, KubeConfigError, in_cluster, load_kubeconfig


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(
    path: Path,
    clusters: dict[str, dict[str, Any]],
    users: dict[str, dict[str, Any]],
    contexts: dict[str, dict[str, Any]],
    current: str | None = None,
) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": c} for n, c in clusters.items()],
        "users": [{"name": n, "user": u} for n, u in users.items()],
        "contexts": [{"name": n, "context": c} for n, c in contexts.items()],
    }
    if current:
        doc["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_inline_data_is_decoded_and_the_current_context_chosen(tmp_path: Path) -> None:
    prod = {"server": "https://prod.example:6443/", "certificate-authority-data": b64(b"CA")}
    alice = {"client-certificate-data": b64(b"CERT"), "client-key-data": b64(b"KEY")}
    path = kubeconfig(
        tmp_path / "config",
        {"prod": prod, "dev": {"server": "https://dev.example:6443"}},
        {"alice": alice, "bob": {"token": "bob-token"}},
        {
            "p": {"cluster": "prod", "user": "alice", "namespace": "team-a"},
            "d": {"cluster": "dev", "user": "bob"},
        },
        current="p",
    )
    config = load_kubeconfig(path)
    assert config.server == "https://prod.example:6443"  # no trailing slash
    assert (config.ca, config.client_cert, config.client_key) == (b"CA", b"CERT", b"KEY")
    assert (config.namespace, config.token, config.insecure) == ("team-a", None, False)
    other = load_kubeconfig(path, context="d")
    assert other.server == "https://dev.example:6443"
    assert (other.token, other.namespace) == ("bob-token", "default")
    assert other.ca is None and other.client_cert is None


def test_files_are_relative_to_their_kubeconfig(tmp_path: Path) -> None:
    home = tmp_path / "kube"
    (home / "pki").mkdir(parents=True)
    (home / "pki" / "ca.crt").write_bytes(b"CA-FILE")
    (home / "pki" / "me.crt").write_bytes(b"CERT-FILE")
    (home / "pki" / "me.key").write_bytes(b"KEY-FILE")
    cluster = {
        "server": "https://c:6443",
        "certificate-authority": "pki/ca.crt",
        "insecure-skip-tls-verify": True,
    }
    user = {
        "client-certificate": "pki/me.crt",
        "client-key": str(home / "pki" / "me.key"),  # an absolute path stays as it is
        "tokenFile": "token",
    }
    path = kubeconfig(
        home / "config", {"c": cluster}, {"u": user}, {"x": {"cluster": "c", "user": "u"}}, "x"
    )
    config = load_kubeconfig(path)
    assert (config.ca, config.client_cert, config.client_key) == (
        b"CA-FILE",
        b"CERT-FILE",
        b"KEY-FILE",
    )
    assert config.insecure and config.token_file == home / "token"


def test_kubeconfig_files_merge_as_kubectl_merges_them(tmp_path: Path) -> None:
    first = kubeconfig(
        tmp_path / "a" / "config",
        {"c": {"server": "https://first:6443"}},
        {"u": {"token": "first-token"}},
        {"x": {"cluster": "c", "user": "u"}},
    )  # no current-context here: the second file's is used
    second = kubeconfig(
        tmp_path / "b" / "config",
        {"c": {"server": "https://second:6443"}, "only": {"server": "https://only:6443"}},
        {"u": {"token": "second-token"}},
        {"x": {"cluster": "c", "user": "u"}, "y": {"cluster": "only", "user": "u"}},
        current="y",
    )
    env = {"KUBECONFIG": f"{first}:{tmp_path / 'missing'}:{second}"}
    chosen = load_kubeconfig(environ=env)
    # The current context is the second file's; the names it uses are the first file's.
    assert (chosen.server, chosen.token) == ("https://only:6443", "first-token")
    assert load_kubeconfig(environ=env, context="x").server == "https://first:6443"


def test_an_exec_plugin_is_read_with_its_command_relative_to_the_kubeconfig(
    tmp_path: Path,
) -> None:
    plugin = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": "./bin/get-token",
        "args": ["--cluster", "c"],
        "env": [{"name": "REGION", "value": "eu"}],
    }
    path = kubeconfig(
        tmp_path / "config",
        {"c": {"server": "https://c:6443"}},
        {"u": {"exec": plugin}},
        {"x": {"cluster": "c", "user": "u"}},
        current="x",
    )
    assert load_kubeconfig(path).exec_plugin == ExecPlugin(
        str(tmp_path / "bin" / "get-token"),
        ("--cluster", "c"),
        (("REGION", "eu"),),
        "client.authentication.k8s.io/v1beta1",
    )


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"current-context": "nope"}, "no context 'nope'"),
        ({"current-context": None}, "current-context unset"),
        (
            {"contexts": [{"name": "x", "context": {"cluster": "gone", "user": "u"}}]},
            "unknown cluster",
        ),
        ({"users": [{"name": "u", "user": {"auth-provider": {"name": "gcp"}}}]}, "auth-provider"),
        (
            {"clusters": [{"name": "c", "cluster": {"server": "https://c", "proxy-url": "http://p"}}]},
            "proxy-url is not supported",
        ),
        ({"clusters": [{"name": "c", "cluster": {"insecure-skip-tls-verify": True}}]}, "no server"),
        ({"users": [{"name": "u", "user": {"client-key": "/nonexistent/key"}}]}, "cannot be read"),
        ({"users": [{"name": "u", "user": {"client-key-data": "not base64!"}}]}, "not base64"),
    ],
)
def test_an_unusable_kubeconfig_says_why(tmp_path: Path, change: dict[str, Any], says: str) -> None:
    doc: dict[str, Any] = {
        "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "https://c:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump({**doc, **change}))
    with pytest.raises(KubeConfigError, match=says):
        load_kubeconfig(path)


def test_a_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="cannot be read"):
        load_kubeconfig(tmp_path / "nope")
    with pytest.raises(KubeConfigError, match="no context"):  # none of $KUBECONFIG's exist
        load_kubeconfig(environ={"KUBECONFIG": str(tmp_path / "nope")})


def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.crt").write_bytes(b"CLUSTER-CA")
    (tmp_path / "namespace").write_text("corral-system\n")
    seen: list[str] = []
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    config = in_cluster(on_token=seen.append, root=tmp_path, environ=env)
    assert config.server == "https://10.0.0.1:443"
    assert (config.namespace, config.ca) == ("corral-system", b"CLUSTER-CA")
    assert config.token_file == tmp_path / "token" and config.token is None
    assert config.on_token == seen.append
    v6 = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster(root=tmp_path, environ=v6).server == "https://[fd00::1]:6443"
    with pytest.raises(KubeConfigError, match="not in a pod"):
        in_cluster(root=tmp_path, environ={})
    (tmp_path / "token").unlink()
    with pytest.raises(KubeConfigError, match="no service-account token"):
        in_cluster(root=tmp_path, environ=env)
