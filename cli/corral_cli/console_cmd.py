"""`corral console [--port N] [--state DIR]`: the web console on this machine (docs/console.md).

Against a cluster it acts with your kubeconfig: every read and every decision is yours, and the
API server's RBAC decides what you see; nothing is stored. With `--state DIR` (or, when no
kubeconfig applies, `corral run`'s state home if it exists: `$XDG_STATE_HOME/corral`, else
`~/.local/state/corral`) it shows `corral run`'s local runs instead: their
transcripts, receipts and pending approvals, which you may approve or deny.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from ._cluster import add_cluster_options, connect
from ._errors import EXIT_OK, CommandError, Parser, exit_epilog
from ._localpaths import state_home


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="corral console",
        description="Serve the web console on this machine, acting with your own credentials.",
        epilog=exit_epilog().replace("0 done", "0 stopped (Ctrl-C)"),
    )
    p.add_argument("--port", type=int, default=8090, help="port to listen on (default 8090)")
    p.add_argument("--address", default="127.0.0.1", help="address to listen on")
    p.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace you may list"
    )
    p.add_argument(
        "--state",
        type=Path,
        metavar="DIR",
        help="show `corral run` state directories (a run's, or a directory of runs such as "
        "~/.local/state/corral) instead of a cluster; the default when no kubeconfig applies: "
        "$XDG_STATE_HOME/corral (else ~/.local/state/corral), if it exists",
    )
    add_cluster_options(p)
    p.set_defaults(namespace=None)
    return p


def state_dir(args: argparse.Namespace) -> Path | None:
    """The state directory to show, or None for the cluster of the kubeconfig."""
    if args.state is not None:
        return Path(args.state)
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG")
    if kubeconfig or args.context or (Path.home() / ".kube" / "config").exists():
        return None
    local = state_home()
    return local if local.is_dir() else None


async def _serve_state(args: argparse.Namespace, root: Path) -> int:
    from corral_operator.console.serve import serve

    from ._console_local import LocalAccess, LocalSource, find_runs

    source = LocalSource(root.resolve())
    runs = len(find_runs(source.root))
    print(f"corral console: http://{args.address}:{args.port}/ ({runs} runs in {root})",
          file=sys.stderr)  # fmt: skip
    await serve(LocalAccess(source), source, args.address, args.port)
    return EXIT_OK


async def _serve_cluster(args: argparse.Namespace) -> int:
    kube, namespace = await connect(args)
    from corral_operator.console.serve import serve_kubeconfig
    from corral_operator.kube import corral_path

    namespaces = None if args.all_namespaces else (namespace,)
    scope = "every namespace" if namespaces is None else namespace
    try:
        # One cheap read first: a console that cannot reach the cluster, or may not list
        # Sessions there, says so and exits rather than serving empty pages.
        sessions = "/apis/corral.dev/v1alpha1/sessions" if namespaces is None else corral_path(
            "Session", namespace)  # fmt: skip
        await kube.request("GET", sessions, query={"limit": "1"})
        print(f"corral console: http://{args.address}:{args.port}/ ({scope})", file=sys.stderr)
        await serve_kubeconfig(kube, namespaces, args.address, args.port, harness_port=8080)
    finally:
        await kube.close()
    return EXIT_OK


def _check_port(address: str, port: int) -> None:
    """The port is free to listen on (uvicorn would log its own error and exit 1)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            raise CommandError(
                f"cannot listen on {address}:{port}: {exc.strerror or exc}",
                "choose another --port (or --address)",
            ) from exc


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if not 0 < args.port < 65536:
        parser.error("--port must be 1-65535")
    root = state_dir(args)
    if root is not None:
        if not root.is_dir():
            raise CommandError(
                f"--state {root} is not a directory", "give a `corral run` state directory"
            )
        if not _loopback(args.address):
            # No sign-in guards a state directory: whoever reaches the port may decide.
            raise CommandError(
                "--state serves on a loopback address only", "drop --address (127.0.0.1)"
            )
    _check_port(args.address, args.port)
    work = _serve_cluster(args) if root is None else _serve_state(args, root)
    try:
        return int(asyncio.run(work))
    except KeyboardInterrupt:
        return EXIT_OK  # Ctrl-C is how a console is stopped
