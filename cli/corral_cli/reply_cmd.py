"""`corral reply SESSION TEXT`: a person answers the question a Session's turn asked
(docs/turns.md). The answer is appended to the Session's `spec.replies`; the operator admits the
next turn, which starts from it. It acts with the caller's own credentials (RBAC: `update` on
sessions).

    corral reply NAME TEXT [-n NS] [--kubeconfig FILE] [--context CTX]

Exit status: 0 replied, 1 the Session is not waiting for a reply (nothing written), 2 an error
(`_errors`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from ._cluster import add_cluster_options, connect, not_found
from ._errors import EXIT_OK, EXIT_OUTCOME, CommandError, Parser, exit_epilog

CONFLICT_RETRIES = 5


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="corral reply",
        description="Answer the question a Session is waiting on.",
        epilog=exit_epilog("the session is not waiting for a reply (nothing written)"),
    )
    p.add_argument("session", help="the Session's name")
    p.add_argument("text", nargs="+", help="the answer (words are joined with spaces)")
    add_cluster_options(p)
    return p


async def reply(args: argparse.Namespace) -> int:
    kube, namespace = await connect(args)
    from corral_kube import MERGE_PATCH, Conflict
    from corral_operator.kube import corral_path

    path = corral_path("Session", namespace, args.session)
    text = " ".join(args.text).strip()
    try:
        for _ in range(CONFLICT_RETRIES):
            session = await kube.get(path)
            if session is None:
                raise not_found("sessions", args.session, namespace)
            status = session.get("status") or {}
            if not status.get("question"):
                phase = status.get("phase", "Pending")
                print(
                    f"corral reply: session {args.session} is not waiting for a reply "
                    f"(phase {phase}, no question in its status)",
                    file=sys.stderr,
                )
                return EXIT_OUTCOME
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
        raise CommandError(
            f"session {args.session} kept changing while the reply was written", "try again"
        )
    finally:
        await kube.close()


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if not " ".join(args.text).strip():
        parser.error("the answer is empty")
    return asyncio.run(reply(args))
