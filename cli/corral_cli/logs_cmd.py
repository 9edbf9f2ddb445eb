"""`corral logs NAME [-f]`: a Session's turn stream as `corral run` shows it (the same view),
read from the operator's archive reader: live from the harness while the sandbox serves, from
the archive once its pod is gone, at the same offsets, so `-f` follows a Session from its first
event to its end across the pod's going (docs/cli.md, docs/history.md)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from ._cluster import add_cluster_options, connect, guarded, not_found
from ._errors import EXIT_OK, Parser, exit_epilog
from ._reader import ReaderClient, add_reader_options
from ._view import choose_view

FOLLOW_WAIT = 10.0
# Nothing to read yet (no pod, no archive): look again after this long.
IDLE_POLL = 1.0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="corral logs", description=__doc__, epilog=exit_epilog())
    p.add_argument("name", help="the Session's name")
    p.add_argument("-f", "--follow", action="store_true", help="follow until the session ends")
    p.add_argument("--json", action="store_true", help="one JSON event per line")
    add_reader_options(p)
    add_cluster_options(p)
    return p


async def _logs(args: argparse.Namespace) -> int:
    kube, namespace = await connect(args)
    try:
        reader = await ReaderClient.from_args(args, kube, namespace)
    finally:
        await kube.close()
    offset = 0
    phase = None
    try:
        with choose_view(f"{namespace}/{args.name}", json_lines=args.json) as view:
            while True:
                page = await reader.transcript(offset, FOLLOW_WAIT if args.follow else 0)
                if page is None:
                    missing = not_found("sessions", args.name, namespace)
                    missing.message += " (live or archived)"
                    raise missing
                for event in page["events"]:
                    view.event(event)
                offset, phase = int(page["offset"]), page.get("phase")
                if not args.follow or (page["final"] and not page["events"]):
                    break
                if page["source"] == "none":
                    await asyncio.sleep(IDLE_POLL)
            if args.follow:
                view.note(f"session {args.name}: {phase} ({offset} events)")
    finally:
        await reader.aclose()
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    return guarded("logs", _logs(build_parser().parse_args(list(argv))))
