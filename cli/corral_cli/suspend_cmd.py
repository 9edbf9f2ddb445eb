"""`corral suspend` / `corral resume`: park a Session and pick it up later (docs/turns.md,
"Suspend and resume"). Each sets the Session's `spec.suspend`, as `kubectl patch` would; the
operator does the rest. They act with the caller's own credentials: who may patch Sessions may
suspend them.

    corral suspend [session] NAME [--now] [-n NS] [--kubeconfig FILE] [--context CTX]
    corral resume [session] NAME [-n NS] [--kubeconfig FILE] [--context CTX]

`suspend` lets the turn in flight finish first (suspendMode afterTurn); `--now` aborts it
(suspendMode now), and it continues after the resume.

Exit status: 0 written (or already so), 1 the Session has ended (nothing written), 2 an error
(`_errors`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from ._cluster import add_cluster_options, connect, not_found
from ._errors import EXIT_OK, EXIT_OUTCOME, CommandError, Parser, exit_epilog

_ENDED = ("Succeeded", "Failed", "Stopped")


def build_parser(command: str) -> argparse.ArgumentParser:
    suspend = command == "suspend"
    p = Parser(
        prog=f"corral {command}",
        description=(
            "Park a Session: its turn in flight ends, its conversation is archived and its pod "
            "deleted; `corral resume` brings it back at the same point."
            if suspend
            else "Resume a suspended Session in a new pod, at the point it was parked."
        ),
        epilog=exit_epilog("the session has ended (nothing written)"),
    )
    p.add_argument("words", nargs="+", metavar="[session] NAME", help="the Session's name")
    if suspend:
        p.add_argument(
            "--now",
            action="store_true",
            help="abort the turn in flight instead of letting it finish (it continues after "
            "the resume)",
        )
    add_cluster_options(p)
    return p


def _session_name(parser: argparse.ArgumentParser, words: list[str]) -> str:
    """NAME or `session NAME`, as kubectl reads `VERB [KIND] NAME`."""
    if len(words) == 2 and words[0] in ("session", "sessions", "sess", "cs"):
        return words[1]
    if len(words) == 1:
        return words[0]
    parser.error("expected one Session: NAME or `session NAME`")
    raise AssertionError  # parser.error exits


async def set_suspend(command: str, name: str, args: argparse.Namespace) -> int:
    kube, namespace = await connect(args)
    from corral_kube import MERGE_PATCH
    from corral_operator.kube import corral_path

    suspend = command == "suspend"
    path = corral_path("Session", namespace, name)
    try:
        session = await kube.get(path)
        if session is None:
            raise not_found("sessions", name, namespace)
        phase = (session.get("status") or {}).get("phase", "Pending")
        if phase in _ENDED:
            print(f"corral {command}: session {name} has ended ({phase}): nothing to "
                  f"{command}", file=sys.stderr)  # fmt: skip
            return EXIT_OUTCOME
        spec: dict[str, object] = {"suspend": suspend}
        if suspend:
            spec["suspendMode"] = "now" if args.now else "afterTurn"
        await kube.request("PATCH", path, body={"spec": spec}, content_type=MERGE_PATCH)
    finally:
        await kube.close()
    if not suspend:
        print(f"session.corral.dev/{name} resumed (a new pod restores its conversation)")
    elif args.now:
        print(f"session.corral.dev/{name} suspended (its turn in flight is aborted)")
    else:
        print(f"session.corral.dev/{name} suspended (its turn in flight finishes first)")
    return EXIT_OK


def main(command: str, argv: Sequence[str]) -> int:
    if command not in ("suspend", "resume"):
        raise CommandError(f"unknown command {command!r}", "use suspend or resume")
    parser = build_parser(command)
    args = parser.parse_args(list(argv))
    name = _session_name(parser, list(args.words))
    return asyncio.run(set_suspend(command, name, args))
