"""The real `corral-gateway` for tests and the bench: built by hack/build-gateway.sh (through
corral_dev.execbin: cached per source revision, once per process), started on free loopback
ports with a bindings file and a hosts file, ready when its /readyz answers 200; and the
destinations it is tested against: a plain HTTP server and a TLS one with a self-signed
certificate, each on a loopback address of its own (127.0.0.2, 127.0.0.3) under names the
hosts file gives it.

Loopback is refused by the gateway, so the tests pass `--allow-range` for the test servers'
addresses (the test tiers' stand-in for the internet); 127.0.0.1 stays refused. Clients bind
their *source* address (curl --interface, httpx's local_address) to 127.0.0.10 and up, the
addresses the bindings file keys.
"""

from __future__ import annotations

import datetime
import hashlib
import http.server
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from corral_dev.execbin import gateway_binary as gateway_binary  # re-exported for the tests
from corral_dev.ports import free_port


def digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


def binding(
    *,
    namespace: str,
    session: str,
    agent: str,
    credential: str | None = None,
    agent_rules: Sequence[dict[str, Any]] = (),
    custodian_rules: Sequence[dict[str, Any]] = (),
    checkout_rules: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The `corral.dev/egress-binding` annotation's object, as the operator writes it."""
    return {
        "v": 1,
        "namespace": namespace,
        "session": session,
        "agent": agent,
        "credentialSha256": digest(credential) if credential else "",
        "agentRules": list(agent_rules),
        "custodianRules": list(custodian_rules),
        "checkoutRules": list(checkout_rules),
    }


def write_bindings(path: Path, entries: Sequence[tuple[str, str, dict[str, Any]]]) -> None:
    """The bindings file: (ip, uid, binding) entries, replaced in one rename (the gateway
    re-reads it when its mtime changes and must never see half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"ip": ip, "uid": uid, "binding": b} for ip, uid, b in entries]))
    os.replace(tmp, path)


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    proxy_port: int
    admin_port: int
    stdout: Path

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def admin_get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.admin_url}{path}", timeout=5)

    def decisions(self) -> list[dict[str, Any]]:
        """The decision log (one JSON line per decision on stdout)."""
        return [json.loads(line) for line in self.stdout.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_gateway(work: Path, args: Sequence[str], *, ready_timeout: float = 30) -> Gateway:
    """Start corral-gateway with `args` (its bindings source among them) on free loopback
    ports and wait for its /readyz."""
    work.mkdir(parents=True, exist_ok=True)
    proxy_port, admin_port = free_port(), free_port()
    stdout = work / f"gateway-{proxy_port}.out"
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    with stdout.open("wb") as out, (work / f"gateway-{proxy_port}.err").open("wb") as err:
        proc = subprocess.Popen(
            [
                str(gateway_binary()),
                "--listen",
                f"127.0.0.1:{proxy_port}",
                "--admin",
                f"127.0.0.1:{admin_port}",
                *args,
            ],
            stdout=out,
            stderr=err,
            env=env,
        )
    gateway = Gateway(proc, proxy_port, admin_port, stdout)
    deadline = time.monotonic() + ready_timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"corral-gateway exited with {proc.returncode}: "
                f"{(work / f'gateway-{proxy_port}.err').read_text()[-4000:]}"
            )
        try:
            if gateway.admin_get("/readyz").status_code == 200:
                return gateway
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            gateway.stop()
            raise RuntimeError(f"corral-gateway not ready after {ready_timeout} s")
        time.sleep(0.02)


# ------------------------------------------------------------------ destinations


def self_signed(work: Path, names: Sequence[str]) -> tuple[Path, Path]:
    """A self-signed certificate (and key) for `names`: the TLS server's and the clients' CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = work / "tls.crt", work / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /bytes/N answers N bytes; anything else answers what it saw (method, Host, and
    whether a Proxy-Authorization arrived, which it never should)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        received = len(self.rfile.read(length)) if length else 0
        if self.path.startswith("/bytes/"):
            size = int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * 65536
            while size > 0:
                self.wfile.write(chunk[: min(size, len(chunk))])
                size -= len(chunk)
            return
        body = json.dumps(
            {
                "method": self.command,
                "host": self.headers.get("Host"),
                "proxyAuthorization": self.headers.get("Proxy-Authorization"),
                "received": received,
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_HEAD = do_PUT = _answer


@dataclass
class Destination:
    address: str
    port: int
    server: http.server.ThreadingHTTPServer

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(address: str, tls: tuple[Path, Path] | None = None, port: int = 0) -> Destination:
    """An HTTP (or, with a certificate, HTTPS) server on `address` and `port` (a free one by
    default)."""
    port = port or free_port(address)
    server = http.server.ThreadingHTTPServer((address, port), _Handler)
    server.daemon_threads = True
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return Destination(address, port, server)


# ------------------------------------------------------------------ a raw client


@dataclass
class ProxyAnswer:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    sock: socket.socket | None  # the tunnel, when the CONNECT was accepted


def proxy_request(
    gateway_port: int, source: str, request: str, *, keep: bool = False, timeout: float = 5
) -> ProxyAnswer:
    """Send one raw request to the gateway from `source` and read its answer's head (and,
    for a refusal, its body); with `keep`, an accepted CONNECT's socket is handed back."""
    sock = socket.create_connection(("127.0.0.1", gateway_port), timeout, (source, 0))
    sock.sendall(request.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(65536)
        if not chunk:
            break
        head += chunk
    raw_head, _, rest = head.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    _, code, *reason = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if keep and code == "200":
        return ProxyAnswer(200, reason[0] if reason else "", headers, rest, sock)
    want = int(headers.get("content-length") or 0)
    while len(rest) < want:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    sock.close()
    return ProxyAnswer(int(code), reason[0] if reason else "", headers, rest, None)


def connect(gateway_port: int, source: str, target: str, auth: str | None = None) -> ProxyAnswer:
    """A CONNECT to `target` (host:port), with a Proxy-Authorization when given."""
    extra = f"Proxy-Authorization: {auth}\r\n" if auth else ""
    return proxy_request(
        gateway_port, source, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra}\r\n"
    )


@contextmanager
def tunnel(
    gateway_port: int, source: str, target: str, auth: str | None = None
) -> Iterator[socket.socket]:
    """An accepted CONNECT tunnel's socket."""
    extra = f"Proxy-Authorization: {auth}\r\n" if auth else ""
    answer = proxy_request(
        gateway_port,
        source,
        f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra}\r\n",
        keep=True,
    )
    if answer.sock is None:
        raise AssertionError(f"CONNECT {target}: {answer.status} {answer.reason}")
    try:
        yield answer.sock
    finally:
        answer.sock.close()
