"""`corral console [--port N]`: the web console on this machine (docs/console.md).

Against a cluster it acts with your kubeconfig: every read and every decision is yours, and the
API server's RBAC decides what you see; nothing is stored. Against a `corral run` state
directory (`--runs .corral/runs`) it shows those local runs, read-only.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from ._cluster import EXIT_ERROR, EXIT_OK, add_cluster_options, connect


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="corral console",
        description="Serve the web console on this machine, acting with your own credentials.",
    )
    p.add_argument("--port", type=int, default=8090, help="port to listen on (default 8090)")
    p.add_argument("--address", default="127.0.0.1", help="address to listen on")
    p.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace you may list"
    )
    p.add_argument(
        "--runs",
        type=Path,
        default=None,
        metavar="DIR",
        help="show the local runs under DIR (e.g. .corral/runs) instead of a cluster",
    )
    add_cluster_options(p)
    p.set_defaults(namespace=None)
    return p


async def _serve_cluster(args: argparse.Namespace) -> int:
    from corral_operator.console.serve import serve_kubeconfig

    kube, namespace = await connect(args)
    namespaces = None if args.all_namespaces else (namespace,)
    print(f"corral console: http://{args.address}:{args.port}/ "
          f"({'every namespace' if namespaces is None else namespace})", file=sys.stderr)  # fmt: skip
    try:
        await serve_kubeconfig(kube, namespaces, args.address, args.port, harness_port=8080)
    finally:
        await kube.close()
    return EXIT_OK


async def _serve_runs(args: argparse.Namespace) -> int:
    from corral_operator.console.localruns import serve_runs

    if not args.runs.is_dir():
        print(f"corral console: {args.runs} is not a directory", file=sys.stderr)
        return EXIT_ERROR
    print(f"corral console: http://{args.address}:{args.port}/ (runs in {args.runs})",
          file=sys.stderr)  # fmt: skip
    await serve_runs(args.runs.resolve(), args.address, args.port)
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if not 0 < args.port < 65536:
        print("corral console: --port must be 1-65535", file=sys.stderr)
        return EXIT_ERROR
    work = _serve_runs(args) if args.runs is not None else _serve_cluster(args)
    try:
        return int(asyncio.run(work))
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as exc:
        print(f"corral console: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
