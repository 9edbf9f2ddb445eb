"""`corral reply SESSION TEXT`: a person answers the question a Session's turn asked
(docs/turns.md). The answer is appended to the Session's `spec.replies`; the operator admits the
next turn, which starts from it. It acts with the caller's own credentials (RBAC: `update` on
sessions).

    corral reply NAME TEXT [-n NS] [--kubeconfig FILE] [--context CTX]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from ._cluster import EXIT_ERROR, EXIT_OK, EXIT_REFUSED, add_cluster_options, connect

CONFLICT_RETRIES = 5


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="corral reply", description="Answer the question a Session is waiting on."
    )
    p.add_argument("session", help="the Session's name")
    p.add_argument("text", nargs="+", help="the answer (words are joined with spaces)")
    add_cluster_options(p)
    return p


async def reply(args: argparse.Namespace) -> int:
    from corral_kube import MERGE_PATCH, Conflict, KubeRefused
    from corral_operator.kube import corral_path

    kube, namespace = await connect(args)
    path = corral_path("Session", namespace, args.session)
    text = " ".join(args.text).strip()
    try:
        for _ in range(CONFLICT_RETRIES):
            session = await kube.get(path)
            if session is None:
                print(f"corral reply: no Session {args.session} in {namespace}", file=sys.stderr)
                return EXIT_REFUSED
            status = session.get("status") or {}
            if not status.get("question"):
                phase = status.get("phase", "Pending")
                print(
                    f"corral reply: session {args.session} is not waiting for a reply "
                    f"(phase {phase}, no question in its status)",
                    file=sys.stderr,
                )
                return EXIT_REFUSED
            replies = [*(session.get("spec") or {}).get("replies", []), text]
            # The resourceVersion makes the append exact: a concurrent reply is a 409, retried.
            body = {
                "metadata": {"resourceVersion": session["metadata"]["resourceVersion"]},
                "spec": {"replies": replies},
            }
            try:
                await kube.request("PATCH", path, body=body, content_type=MERGE_PATCH)
            except Conflict:
                continue
            print(f"session.corral.dev/{args.session} replied ({len(replies)} replies)")
            return EXIT_OK
        print("corral reply: the Session kept changing; try again", file=sys.stderr)
        return EXIT_REFUSED
    except KubeRefused as err:
        print(f"corral reply: the API server refused: {err}", file=sys.stderr)
        return EXIT_REFUSED
    finally:
        await kube.close()


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if not " ".join(args.text).strip():
        print("corral reply: the answer is empty", file=sys.stderr)
        return EXIT_ERROR
    return asyncio.run(reply(args))
