"""corral-gateway as a process: real curl and httpx through it, from bound source addresses.

One gateway for the module, started with a bindings file and a hosts file. 127.0.0.10 is a
Session's sandbox (agent "coder", with a custodian credential); 127.0.0.11 an Evidence's pod
(session "", no custodian); 127.0.0.13 a sandbox whose Agent wrote CIDR rules around the
metadata and loopback addresses; 127.0.0.12 is no sandbox at all. web.test is a plain HTTP server
on 127.0.0.2, tls.test and custodian.test a TLS server on 127.0.0.3 (both under
--allow-range); rebind.test resolves to 127.0.0.1, which stays refused; platform.test is a
plain server on 127.0.0.6, a refused address that only the platform's rule (private) reaches.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest

from ._gateway import (
    Destination,
    Gateway,
    binding,
    connect,
    proxy_request,
    self_signed,
    serve,
    start_gateway,
    tunnel,
    write_bindings,
)

pytestmark = pytest.mark.timeout(60)

AGENT_IP, EVIDENCE_IP, PROBER_IP = "127.0.0.10", "127.0.0.11", "127.0.0.13"
STRANGER_IP = "127.0.0.12"
WEB_IP, TLS_IP, PLATFORM_IP = "127.0.0.2", "127.0.0.3", "127.0.0.6"
CREDENTIAL = "session-proxy-credential-1"


@dataclass
class Rig:
    gateway: Gateway
    web: Destination
    platform: Destination
    tls: Destination
    ca: Path
    bindings: Path
    entries: list[tuple[str, str, dict[str, object]]]


def session_binding(credential: str, web: int, tls: int) -> dict[str, object]:
    return binding(
        namespace="team-a",
        session="s1",
        agent="coder",
        credential=credential,
        agent_rules=[
            {"host": "tls.test", "ports": [tls]},
            {"host": "rebind.test", "ports": [tls]},
            {"host": "web.test", "ports": [web], "methods": ["GET", "HEAD"]},
        ],
        custodian_rules=[{"host": "custodian.test", "ports": [tls]}],
    )


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    work = tmp_path_factory.mktemp("gateway")
    cert, key = self_signed(work, ["tls.test", "custodian.test"])
    web, tls, platform = serve(WEB_IP), serve(TLS_IP, (cert, key)), serve(PLATFORM_IP)
    hosts = work / "hosts"
    hosts.write_text(
        f"{WEB_IP} web.test\n{TLS_IP} tls.test custodian.test\n127.0.0.1 rebind.test\n"
        f"{PLATFORM_IP} platform.test\n"
    )
    bindings = work / "bindings.json"
    entries: list[tuple[str, str, dict[str, object]]] = [
        (AGENT_IP, "pod-1", session_binding(CREDENTIAL, web.port, tls.port)),
        (
            EVIDENCE_IP,
            "pod-2",
            binding(
                namespace="team-a",
                session="",
                agent="checker",
                agent_rules=[{"host": "web.test", "ports": [web.port]}],
            ),
        ),
        (
            PROBER_IP,
            "pod-3",
            binding(
                namespace="team-b",
                session="s3",
                agent="prober",
                # Wider than the refused ranges they cover: they name no private address.
                agent_rules=[
                    {"cidr": "169.254.0.0/15", "ports": [80]},
                    {"cidr": "126.0.0.0/7", "ports": [80]},
                ],
            ),
        ),
    ]
    write_bindings(bindings, entries)
    gateway = start_gateway(
        work,
        [
            "--bindings-file", str(bindings),
            "--hosts-file", str(hosts),
            "--allow-range", f"{WEB_IP}/32",
            "--allow-range", f"{TLS_IP}/32",
            "--connect-timeout", "2s",
            "--platform-rule",
            json.dumps({"host": "platform.test", "ports": [platform.port], "private": True}),
        ],
    )  # fmt: skip
    yield Rig(gateway, web, platform, tls, cert, bindings, entries)
    gateway.stop()
    web.stop()
    platform.stop()
    tls.stop()


def curl(rig: Rig, source: str, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """curl from `source` with the proxy in its variables, as a sandbox's tools get it."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    # curl reads http_proxy in lower case only
    env.update(HTTPS_PROXY=rig.gateway.proxy_url, http_proxy=rig.gateway.proxy_url)
    return subprocess.run(
        ["curl", "-sS", "-v", "--max-time", "10", "--interface", source, "--cacert", str(rig.ca),
         *args, url],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


class BoundBackend(httpcore.SyncBackend):
    """Connections from one source address (the sandbox's)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return super().connect_tcp(host, port, timeout, self.source, socket_options)


def basic(password: str) -> str:
    return "Basic " + base64.b64encode(f"custodian:{password}".encode()).decode()


def records(rig: Rig, session: str = "s1") -> dict[str, object]:
    answer = rig.gateway.admin_get(f"/v1/egress?namespace=team-a&session={session}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def row(report: dict[str, object], host: str, identity: str, decision: str) -> dict[str, object]:
    rows = [
        r
        for r in report["hosts"]  # type: ignore[attr-defined]
        if r["host"] == host and r["identity"] == identity and r["decision"] == decision
    ]
    assert len(rows) == 1, report
    return dict(rows[0])


def test_allowed_host_through_https_proxy_with_curl(rig: Rig) -> None:
    done = curl(rig, AGENT_IP, f"https://tls.test:{rig.tls.port}/bytes/300000", "-o", os.devnull)
    assert done.returncode == 0, done.stderr
    assert "< HTTP/1.1 200" in done.stderr
    report = records(rig)
    allowed = row(report, "tls.test", "agent", "allowed")
    assert allowed["port"] == rig.tls.port and allowed["count"] >= 1
    assert int(allowed["bytesDown"]) > 300000  # type: ignore[call-overload]
    assert int(allowed["bytesUp"]) > 0  # type: ignore[call-overload]


def test_allowed_host_with_httpx_and_plain_http_methods(rig: Rig) -> None:
    context = ssl.create_default_context(cafile=str(rig.ca))
    transport = httpx.HTTPTransport(proxy=httpx.Proxy(rig.gateway.proxy_url), verify=context)
    # httpx's local_address does not reach a proxy's connections: a backend binds them.
    transport._pool = httpcore.HTTPProxy(
        proxy_url=rig.gateway.proxy_url, ssl_context=context, network_backend=BoundBackend(AGENT_IP)
    )
    with httpx.Client(transport=transport, timeout=10) as client:
        answer = client.get(f"https://tls.test:{rig.tls.port}/hello")
        assert answer.status_code == 200 and answer.json()["method"] == "GET"
        plain = client.get(f"http://web.test:{rig.web.port}/page")
        assert plain.status_code == 200
        assert plain.json()["host"] == f"web.test:{rig.web.port}"
        refused = client.post(f"http://web.test:{rig.web.port}/page", content=b"payload")
    assert refused.status_code == 403
    assert refused.headers["x-corral-egress-reason"] == "method-not-allowed"
    assert "the rule allows methods GET, HEAD" in refused.text


def test_denied_host_reason_is_visible_to_curl(rig: Rig) -> None:
    done = curl(rig, AGENT_IP, "https://pypi.org/simple/")
    assert done.returncode != 0
    assert (
        '< HTTP/1.1 403 Corral egress: pypi.org:443 is not allowed for agent "coder" '
        "(add it to the Agent's sandbox.egress)" in done.stderr
    ), done.stderr
    assert "X-Corral-Egress-Reason: not-allowed" in done.stderr
    plain = curl(rig, AGENT_IP, "http://nowhere.test:8080/")
    assert "is not allowed for agent" in plain.stdout


def test_custodian_destination_needs_the_credential(rig: Rig) -> None:
    url = f"https://custodian.test:{rig.tls.port}/v1/messages"
    as_agent = curl(rig, AGENT_IP, url)
    assert "< HTTP/1.1 403 Corral egress" in as_agent.stderr
    as_custodian = curl(rig, AGENT_IP, url, "--proxy-user", f"custodian:{CREDENTIAL}")
    assert as_custodian.returncode == 0, as_custodian.stderr
    assert json.loads(as_custodian.stdout)["proxyAuthorization"] is None
    forged = curl(rig, AGENT_IP, url, "--proxy-user", "custodian:guessed")
    assert "< HTTP/1.1 407 Corral egress: the Proxy-Authorization does not match" in forged.stderr
    # A forged credential is refused even where the agent itself may go.
    answer = connect(rig.gateway.proxy_port, AGENT_IP, f"tls.test:{rig.tls.port}", basic("guessed"))
    assert answer.status == 407 and answer.headers["x-corral-egress-reason"] == "bad-credential"
    # The custodian's plain http request reaches the destination without the credential.
    assert row(records(rig), "custodian.test", "custodian", "allowed")["count"] == 1
    log = rig.gateway.stdout.read_text()
    assert CREDENTIAL not in log and "guessed" not in log


def test_platform_rule_is_the_custodians_and_may_be_private(rig: Rig) -> None:
    target = f"platform.test:{rig.platform.port}"
    as_agent = connect(rig.gateway.proxy_port, AGENT_IP, target)
    assert as_agent.status == 403 and as_agent.headers["x-corral-egress-reason"] == "not-allowed"
    with tunnel(rig.gateway.proxy_port, AGENT_IP, target, basic(CREDENTIAL)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: platform.test\r\nConnection: close\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
    done = curl(rig, AGENT_IP, f"http://{target}/", "--proxy-user", f"custodian:{CREDENTIAL}")
    assert done.returncode == 0 and json.loads(done.stdout)["method"] == "GET", done.stderr


def test_rotated_credential_is_refused(rig: Rig) -> None:
    target = f"custodian.test:{rig.tls.port}"
    rotated = "session-proxy-credential-2"
    entries = list(rig.entries)
    entries[0] = (AGENT_IP, "pod-1", session_binding(rotated, rig.web.port, rig.tls.port))
    write_bindings(rig.bindings, entries)
    try:
        deadline = time.monotonic() + 5
        while connect(rig.gateway.proxy_port, AGENT_IP, target, basic(CREDENTIAL)).status != 407:
            assert time.monotonic() < deadline, "the rewritten bindings file was not read"
            time.sleep(0.05)
        with tunnel(rig.gateway.proxy_port, AGENT_IP, target, basic(rotated)):
            pass
    finally:
        write_bindings(rig.bindings, rig.entries)
        deadline = time.monotonic() + 5
        while connect(rig.gateway.proxy_port, AGENT_IP, target, basic(CREDENTIAL)).status != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_unknown_source(rig: Rig) -> None:
    done = curl(rig, STRANGER_IP, f"https://tls.test:{rig.tls.port}/")
    assert f"< HTTP/1.1 403 Corral egress: {STRANGER_IP} is not a known sandbox" in done.stderr
    assert rig.gateway.admin_get(f"/v1/bindings?ip={STRANGER_IP}").status_code == 404
    known = rig.gateway.admin_get(f"/v1/bindings?ip={AGENT_IP}").json()
    assert {k: v for k, v in known.items() if k != "digest"} == {
        "uid": "pod-1", "namespace": "team-a", "session": "s1", "agent": "coder", "custodian": True,
    }  # fmt: skip
    assert len(known["digest"]) == 64  # the binding text's SHA-256 (an adoption waits for it)


def test_name_resolving_to_loopback_is_refused(rig: Rig) -> None:
    answer = connect(rig.gateway.proxy_port, AGENT_IP, f"rebind.test:{rig.tls.port}")
    assert answer.status == 403
    assert answer.headers["x-corral-egress-reason"] == "private-address"
    assert "127.0.0.1" in answer.body.decode()
    loopback = connect(rig.gateway.proxy_port, PROBER_IP, "127.0.0.1:80")
    assert loopback.headers["x-corral-egress-reason"] == "private-address"


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("169.254.169.254:80", "private-address"),
        ("2852039166:80", "bad-host"),
        ("0251.0376.0251.0376:80", "bad-host"),
        ("0xa9fea9fe:80", "bad-host"),
        ("[::ffff:169.254.169.254]:80", "private-address"),
        ("[::ffff:a9fe:a9fe]:80", "private-address"),
    ],
)
def test_metadata_address_in_every_spelling_is_refused(rig: Rig, target: str, reason: str) -> None:
    answer = connect(rig.gateway.proxy_port, PROBER_IP, target)
    assert answer.status == 403, answer
    assert answer.headers["x-corral-egress-reason"] == reason
    plain = proxy_request(
        rig.gateway.proxy_port,
        PROBER_IP,
        f"GET http://{target}/latest/meta-data/ HTTP/1.1\r\nHost: {target}\r\n\r\n",
    )
    assert plain.status == 403 and plain.headers["x-corral-egress-reason"] == reason


def test_connect_to_an_unlisted_port(rig: Rig) -> None:
    answer = connect(rig.gateway.proxy_port, AGENT_IP, "tls.test:444")
    assert answer.status == 403
    assert answer.headers["x-corral-egress-reason"] == "port-not-allowed"
    assert f"not among the rule's ports ({rig.tls.port})" in answer.reason


def test_trailing_dot_and_upper_case_name_the_same_host(rig: Rig) -> None:
    context = ssl.create_default_context(cafile=str(rig.ca))
    with (
        tunnel(rig.gateway.proxy_port, AGENT_IP, f"TLS.Test.:{rig.tls.port}") as sock,
        context.wrap_socket(sock, server_hostname="tls.test") as tls,
    ):
        tls.sendall(b"GET /x HTTP/1.1\r\nHost: tls.test\r\nConnection: close\r\n\r\n")
        assert tls.recv(100).startswith(b"HTTP/1.1 200")
    dotted = connect(rig.gateway.proxy_port, AGENT_IP, f"tls.test..:{rig.tls.port}")
    assert dotted.headers["x-corral-egress-reason"] == "bad-host"


def test_evidence_binding_records_under_an_empty_session(rig: Rig) -> None:
    done = curl(rig, EVIDENCE_IP, f"http://web.test:{rig.web.port}/bytes/1000", "-o", os.devnull)
    assert done.returncode == 0, done.stderr
    report = records(rig, session="")
    assert report["agent"] == "checker"
    assert row(report, "web.test", "agent", "allowed")["bytesDown"] == 1000


def test_records_and_metrics_reflect_the_calls(rig: Rig) -> None:
    for _ in range(2):
        connect(rig.gateway.proxy_port, AGENT_IP, "denied-twice.test:443")
    report = records(rig)
    denied = row(report, "denied-twice.test", "agent", "denied")
    assert denied["count"] == 2 and denied["reason"] == "not-allowed"
    assert denied["firstSeen"].endswith("Z") and denied["lastSeen"].endswith("Z")  # type: ignore[union-attr]
    assert rig.gateway.admin_get("/v1/egress?namespace=team-a&session=nope").status_code == 404
    summaries = rig.gateway.admin_get("/v1/egress").json()["sessions"]
    assert {(s["namespace"], s["session"]) for s in summaries} >= {("team-a", "s1")}

    metrics = rig.gateway.admin_get("/metrics").text
    assert (
        'corral_gateway_requests_total{namespace="team-a",agent="coder",host="denied-twice.test",'
        'decision="denied",identity="agent"} 2' in metrics
    )
    assert "corral_gateway_bindings 3" in metrics
    up = [line for line in metrics.splitlines() if line.startswith("corral_gateway_bytes_total")]
    assert any('agent="coder",direction="down"' in line and not line.endswith(" 0") for line in up)
    for name in ("corral_gateway_connections ", "corral_gateway_watch_restarts_total "):
        assert name in metrics
    decisions = rig.gateway.decisions()
    assert {"decision", "reason", "identity", "host", "port", "source"} <= set(decisions[-1])
    assert any(d["host"] == "denied-twice.test" and d["decision"] == "denied" for d in decisions)
