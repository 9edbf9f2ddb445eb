"""The custodian behind the egress gateway (docs/egress.md): its requests and git's carry the
Session's proxy credential, the credential is redacted in every form it travels in, and git://
remotes tunnel through CONNECT with it."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from corral_common import proxytunnel
from corral_custodian import _secrets
from corral_custodian._egress import use_egress_gateway
from corral_custodian.settings import SettingsError, from_env, register_credentials

CREDENTIAL = "p" * 20 + "-proxy-credential-" + "q" * 10


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    key = tmp_path / "credential"
    key.write_text(CREDENTIAL + "\n")
    return {
        "CORRAL_UPSTREAM_URL": "https://api.anthropic.com",
        "CORRAL_CUSTODIAN_INSECURE": "1",
        "CORRAL_AGENT_SPEC_JSON": '{"identity": "You write code.", "model": "claude-test"}',
        "CORRAL_EGRESS_PROXY": "http://198.19.0.40:3128",
        "CORRAL_EGRESS_CREDENTIAL_FILE": str(key),
        **extra,
    }


def test_the_process_and_its_git_reach_out_through_the_gateway_as_the_custodian(
    tmp_path: Path,
) -> None:
    settings = from_env(_env(tmp_path))
    env: dict[str, str] = {}
    use_egress_gateway(settings, env)
    url = f"http://custodian:{CREDENTIAL}@198.19.0.40:3128"
    assert env["HTTPS_PROXY"] == env["https_proxy"] == env["HTTP_PROXY"] == url
    assert env["GIT_PROXY_COMMAND"] == "corral-proxy-tunnel"


def test_the_credential_is_redacted_alone_in_the_url_and_in_the_header(tmp_path: Path) -> None:
    register_credentials(from_env(_env(tmp_path)))
    header = base64.b64encode(f"custodian:{CREDENTIAL}".encode()).decode()
    for text in (CREDENTIAL, f"http://custodian:{CREDENTIAL}@gw:3128", f"Basic {header}"):
        assert CREDENTIAL not in _secrets.redact(text) and header not in _secrets.redact(text)


def test_a_proxy_without_its_credential_is_refused_at_start(tmp_path: Path) -> None:
    env = _env(tmp_path)
    del env["CORRAL_EGRESS_CREDENTIAL_FILE"]
    with pytest.raises(SettingsError, match="CORRAL_EGRESS_PROXY and CORRAL_EGRESS_CREDENTIAL"):
        from_env(env)


class _Gateway(threading.Thread):
    """A one-connection CONNECT proxy on loopback: answers 200 and echoes, or refuses."""

    def __init__(self, refuse: bool) -> None:
        super().__init__(daemon=True)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.refuse = refuse
        self.head = b""

    def run(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            while b"\r\n\r\n" not in self.head:
                self.head += conn.recv(4096)
            if self.refuse:
                conn.sendall(b"HTTP/1.1 403 Corral egress: git.example:9418 is not allowed\r\n\r\n")
                return
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            while data := conn.recv(4096):
                conn.sendall(data.upper())


def _tunnel(port: int, proxy_user: str | None) -> subprocess.CompletedProcess[bytes]:
    auth = f"{proxy_user}@" if proxy_user else ""
    env = {**os.environ, "HTTPS_PROXY": f"http://{auth}127.0.0.1:{port}"}
    code = "from corral_common.proxytunnel import main; raise SystemExit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, "git.example", "9418"],
        input=b"hello over git://\n",
        env=env,
        capture_output=True,
        timeout=30,
        check=False,
    )


def test_the_tunnel_carries_the_stream_with_the_credential() -> None:
    gateway = _Gateway(refuse=False)
    gateway.start()
    done = _tunnel(gateway.port, f"custodian:{CREDENTIAL}")
    gateway.join(10)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"HELLO OVER GIT://\n"
    pair = base64.b64encode(f"custodian:{CREDENTIAL}".encode()).decode()
    assert gateway.head.startswith(b"CONNECT git.example:9418 HTTP/1.1\r\n")
    assert f"Proxy-Authorization: Basic {pair}".encode() in gateway.head


def test_a_refused_tunnel_says_why_and_exits_1() -> None:
    gateway = _Gateway(refuse=True)
    gateway.start()
    done = _tunnel(gateway.port, None)
    gateway.join(10)
    assert done.returncode == 1
    assert b"is not allowed" in done.stderr
    assert b"Proxy-Authorization" not in gateway.head  # the tools' side has no credential


def test_no_proxy_set_is_a_usage_error() -> None:
    assert proxytunnel.main(["git.example", "9418"], env={}) == 2


def test_the_custodians_git_runs_see_the_gateway_and_nothing_else_of_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral_custodian._git import GitPusher

    env: dict[str, str] = {}
    settings = from_env(_env(tmp_path))
    use_egress_gateway(settings, env)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CORRAL_WIRE_TOKEN_FILE", "/not/for/git")
    seen = GitPusher(tmp_path / "mirror", "git://git.example/repo", None)._env()
    # A clean environment, but with the proxy: git:// through the tunnel, https through the
    # proxy variables, both carrying the credential.
    assert seen["GIT_PROXY_COMMAND"] == "corral-proxy-tunnel"
    assert CREDENTIAL in seen["HTTPS_PROXY"] and seen["NO_PROXY"].startswith("localhost")
    assert "CORRAL_WIRE_TOKEN_FILE" not in seen


def test_an_adopt_delivers_the_proxy_credential_and_the_memory_dsn_as_files(
    tmp_path: Path,
) -> None:
    """A pooled custodian's environment names the adopt's secrets by file, never by value."""
    from corral_api.wire import AdoptedSession, CustodianAdoptRequest
    from corral_custodian._adopt import adopted_env
    from tests._objects import agent

    request = CustodianAdoptRequest(
        wireToken="w" * 43,
        custodianCredential="c" * 43,
        session=AdoptedSession(name="s1", namespace="team", uid="uid-1"),
        agentName="coder",
        agent=agent().spec,
        branch="corral/s1",
        gitRemoteUrl="https://git.example/r.git",
        egressCredential="e" * 43,
        memoryDsn="postgresql://u:pw@db:5432/m",
    )
    env = adopted_env({"CORRAL_EGRESS_PROXY": "http://198.18.0.40:3128"}, request, tmp_path)
    assert env["CORRAL_EGRESS_CREDENTIAL_FILE"] == str(tmp_path / "egress")
    assert env["CORRAL_MEMORY_DSN_FILE"] == str(tmp_path / "memory-dsn")
    assert "e" * 43 not in "".join(env.values()) and "pw@" not in "".join(env.values())
    bare = adopted_env({}, request.model_copy(update={"egressCredential": None}), tmp_path)
    assert "CORRAL_EGRESS_CREDENTIAL_FILE" not in bare
