"""`corral console [--port N]`: the web console on this machine (docs/console.md).

Against a cluster it acts with your kubeconfig: every read and every decision is yours, and the
API server's RBAC decides what you see; nothing is stored.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

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
    add_cluster_options(p)
    p.set_defaults(namespace=None)
    return p


async def _serve_cluster(args: argparse.Namespace) -> int:
    from corral_operator.console.serve import serve_kubeconfig

    kube, namespace = await connect(args)
    namespaces = None if args.all_namespaces else (namespace,)
    scope = "every namespace" if namespaces is None else namespace
    print(f"corral console: http://{args.address}:{args.port}/ ({scope})", file=sys.stderr)
    try:
        await serve_kubeconfig(kube, namespaces, args.address, args.port, harness_port=8080)
    finally:
        await kube.close()
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if not 0 < args.port < 65536:
        print("corral console: --port must be 1-65535", file=sys.stderr)
        return EXIT_ERROR
    work = _serve_cluster(args)
    try:
        return int(asyncio.run(work))
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as exc:
        print(f"corral console: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
