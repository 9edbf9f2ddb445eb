"""Egress gateway benchmark: what going through corral-gateway costs a sandbox, on loopback.

In one run, against one TLS server (a separate process on 127.0.0.3, under a name the
gateway's hosts file gives it, with --allow-range):

- throughput: an HTTPS download (64 MiB by default) by curl, direct and through the gateway
  (curl's HTTPS_PROXY, from the bound source address 127.0.0.10), alternating, median of the
  runs; the median of each run's ratio via / direct;
- added connection latency: the median of 200 CONNECT+TLS handshakes through the gateway
  minus the median of 200 direct TLS handshakes, alternating;
- 1,000 concurrent held CONNECT tunnels (to a plain TCP server that holds them): the
  gateway's RSS while they are open.

Targets on a 2-core machine: ratio >= 0.8, added latency <= 5 ms, RSS < 200 MB.

    python bench/gateway_bench.py [--mib 64] [--runs 9] [--handshakes 200] [--tunnels 1000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.wire._gateway import binding, self_signed, serve, start_gateway, write_bindings

from corral_dev.ports import free_port

SOURCE_IP, TLS_IP, HOLD_IP = "127.0.0.10", "127.0.0.3", "127.0.0.4"
RATIO_TARGET = 0.8
LATENCY_TARGET_MS = 5.0
RSS_TARGET_MB = 200.0


def _serve_tls(port: int, cert: str, key: str) -> None:
    serve(TLS_IP, (Path(cert), Path(key)), port)
    threading.Event().wait()


def _hold(listener: socket.socket, held: list[socket.socket]) -> None:
    """Accept and keep every connection (a tunnel's far end that never speaks)."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        held.append(conn)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def download(url: str, ca: Path, proxy: str | None) -> float:
    """curl's download speed in MB/s (10^6 bytes), through `proxy` when given."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    args = ["curl", "-sS", "--cacert", str(ca), "-o", os.devnull, "-w", "%{speed_download}"]
    if proxy:
        env["HTTPS_PROXY"] = proxy
        args += ["--interface", SOURCE_IP]
    else:
        host_port = url.split("//", 1)[1].split("/", 1)[0]
        args += ["--resolve", f"{host_port}:{TLS_IP}"]
    done = subprocess.run([*args, url], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout) / 1e6


def handshake(context: ssl.SSLContext, port: int, proxy_port: int | None) -> float:
    """Seconds from connect to a finished TLS handshake, directly or through a CONNECT."""
    started = time.perf_counter()
    if proxy_port is None:
        sock = socket.create_connection((TLS_IP, port))
    else:
        sock = socket.create_connection(("127.0.0.1", proxy_port), 5, (SOURCE_IP, 0))
        sock.sendall(f"CONNECT tls.test:{port} HTTP/1.1\r\nHost: tls.test:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                raise RuntimeError("the gateway closed the tunnel")
            head += chunk
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(head.split(b"\r\n", 1)[0].decode())
    with context.wrap_socket(sock, server_hostname="tls.test"):
        elapsed = time.perf_counter() - started
    return elapsed


def open_tunnels(proxy_port: int, target: str, count: int) -> list[socket.socket]:
    tunnels = []
    request = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", proxy_port), 10, (SOURCE_IP, 0))
        sock.sendall(request)
        tunnels.append(sock)
    for sock in tunnels:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                raise RuntimeError("a tunnel was closed")
            head += chunk
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(head.split(b"\r\n", 1)[0].decode())
    return tunnels


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--handshakes", type=int, default=200)
    parser.add_argument("--tunnels", type=int, default=1000)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.tunnels + 256)), hard))

    with tempfile.TemporaryDirectory(prefix="corral-gateway-bench-") as tmp:
        work = Path(tmp)
        cert, key = self_signed(work, ["tls.test"])
        tls_port = free_port(TLS_IP)
        server = multiprocessing.get_context("spawn").Process(
            target=_serve_tls, args=(tls_port, str(cert), str(key)), daemon=True
        )
        server.start()
        hold = socket.create_server((HOLD_IP, 0), backlog=4096)
        held: list[socket.socket] = []
        threading.Thread(target=_hold, args=(hold, held), daemon=True).start()
        hold_port = hold.getsockname()[1]

        (work / "hosts").write_text(f"{TLS_IP} tls.test\n{HOLD_IP} hold.test\n")
        rules = [
            {"host": "tls.test", "ports": [tls_port]},
            {"host": "hold.test", "ports": [hold_port]},
        ]
        write_bindings(
            work / "bindings.json",
            [(SOURCE_IP, "bench-pod", binding(namespace="bench", session="s", agent="bench",
                                              agent_rules=rules))],
        )  # fmt: skip
        gateway = start_gateway(
            work,
            [
                "--bindings-file", str(work / "bindings.json"),
                "--hosts-file", str(work / "hosts"),
                "--allow-range", f"{TLS_IP}/32",
                "--allow-range", f"{HOLD_IP}/32",
            ],
        )  # fmt: skip
        try:
            context = ssl.create_default_context(cafile=str(cert))
            deadline = time.monotonic() + 10
            while True:  # the server process is up when a direct handshake succeeds
                try:
                    handshake(context, tls_port, None)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

            url = f"https://tls.test:{tls_port}/bytes/{args.mib * 1024 * 1024}"
            direct, via = [], []
            for i in range(args.runs):
                order = [False, True] if i % 2 == 0 else [True, False]
                for through in order:
                    speed = download(url, cert, gateway.proxy_url if through else None)
                    (via if through else direct).append(speed)

            direct_hs, via_hs = [], []
            for i in range(args.handshakes):
                for through in [False, True] if i % 2 == 0 else [True, False]:
                    seconds = handshake(context, tls_port, gateway.proxy_port if through else None)
                    (via_hs if through else direct_hs).append(seconds)

            idle_rss = rss_mb(gateway.proc.pid)
            tunnels = open_tunnels(gateway.proxy_port, f"hold.test:{hold_port}", args.tunnels)
            time.sleep(0.5)
            held_rss = rss_mb(gateway.proc.pid)
            open_now = [
                line
                for line in gateway.admin_get("/metrics").text.splitlines()
                if line.startswith("corral_gateway_connections ")
            ]
            for sock in tunnels:
                sock.close()
        finally:
            gateway.stop()
            server.terminate()
            hold.close()

    # Each run's two downloads sit side by side in time: the median of their ratios is
    # steadier on a busy machine than the ratio of two medians.
    ratio = statistics.median(v / d for d, v in zip(direct, via, strict=True))
    added_ms = (statistics.median(via_hs) - statistics.median(direct_hs)) * 1000
    print(
        f"HTTPS download of {args.mib} MiB (curl, loopback, {args.runs} runs each, alternating): "
        f"direct median {statistics.median(direct):.0f} MB/s, through the gateway "
        f"{statistics.median(via):.0f} MB/s"
    )
    print(
        f"throughput via / direct, median of the runs' ratios: {ratio:.3f} "
        f"(target >= {RATIO_TARGET:.2f})"
    )
    print(
        f"CONNECT+TLS handshake, median of {args.handshakes}: direct "
        f"{statistics.median(direct_hs) * 1000:.2f} ms, through the gateway "
        f"{statistics.median(via_hs) * 1000:.2f} ms; added {added_ms:.2f} ms "
        f"(target <= {LATENCY_TARGET_MS:.0f} ms)"
    )
    print(
        f"{args.tunnels} held tunnels: gateway RSS {held_rss:.1f} MB (idle {idle_rss:.1f} MB; "
        f"target < {RSS_TARGET_MB:.0f} MB); {open_now[0] if open_now else ''}"
    )
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if ratio < RATIO_TARGET or added_ms > LATENCY_TARGET_MS or held_rss >= RSS_TARGET_MB:
        print("TARGET MISSED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
