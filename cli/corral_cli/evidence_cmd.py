"""`corral evidence check`: the CI gate (docs/ci.md).

    corral evidence check --repo URL --revision SHA [--check NAME] [--wait DURATION] [-n NS]

Finds the Evidence of that revision of that repository by its labels (check name, revision, a
hash of the repository URL: `corral_api.labels`), reads the verdict that counts per check
(`corral_api.evidence.verdicts_at`), prints it, and exits:

    0  Pass (every check found, or the one named, passed)
    1  Fail (a check failed)
    2  an error: no such check, a check that could not run (verdict Error), bad usage, the
       API server refusing or unreachable, anything unexpected; never 1
    3  still pending when the wait ran out
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from corral_api.evidence import verdicts_at
from corral_api.labels import EVIDENCE_CHECK, EVIDENCE_REPO, EVIDENCE_REVISION, repo_hash

from ._cluster import EXIT_ERROR, EXIT_OK, add_cluster_options, connect, parse_duration

EXIT_FAIL = 1
EXIT_PENDING = 3
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
_POLL_SECONDS = 2.0


class _Usage(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 too; keep the message ours
        raise _Usage(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="corral evidence check",
        description="Print the Evidence verdict at a revision and exit by it (a CI gate).",
        epilog="exit status: 0 Pass, 1 Fail, 2 error or no such check, 3 still pending when "
        "the wait ran out",
    )
    p.add_argument("--repo", required=True, help="the repository URL, exactly as the Session's "
                   "spec.workspace.repo names it")  # fmt: skip
    p.add_argument("--revision", required=True, help="the full 40-character commit SHA")
    p.add_argument("--check", help="only this check (default: every check at the revision)")
    p.add_argument("--wait", default="0", help="wait up to this long for a verdict: 90s, 10m")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    add_cluster_options(p)
    return p


def selector(repo: str, revision: str, check: str | None) -> str:
    labels = {EVIDENCE_REVISION: revision, EVIDENCE_REPO: repo_hash(repo)}
    if check is not None:
        labels[EVIDENCE_CHECK] = check
    return ",".join(f"{k}={v}" for k, v in labels.items())


def overall(verdicts: Mapping[str, str]) -> str:
    """One verdict for the gate: a Fail anywhere fails; then an Error; then waiting."""
    if not verdicts:
        return "Missing"
    for verdict in ("Fail", "Error", "Pending", "Missing"):
        if verdict in verdicts.values():
            return verdict
    return "Pass"


EXIT_BY_VERDICT = {
    "Pass": EXIT_OK,
    "Fail": EXIT_FAIL,
    "Error": EXIT_ERROR,
    "Missing": EXIT_ERROR,
    "Pending": EXIT_PENDING,
}


async def _check(args: argparse.Namespace, wait_seconds: float) -> int:
    from corral_operator.kube import corral_path

    kube, namespace = await connect(args)
    deadline = time.monotonic() + wait_seconds
    try:
        while True:
            found = await kube.list(
                corral_path("Evidence", namespace), selector(args.repo, args.revision, args.check)
            )
            verdicts = verdicts_at(found, args.revision, args.repo, args.check, namespace)
            verdict = overall(verdicts)
            # Missing may still come (the operator creates Evidence when a landing is asked).
            if verdict not in ("Pending", "Missing") or time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
    finally:
        await kube.close()
    _report(args, namespace, verdicts, verdict)
    return EXIT_BY_VERDICT[verdict]


def _report(
    args: argparse.Namespace, namespace: str, verdicts: Mapping[str, str], verdict: str
) -> None:
    if args.output == "json":
        print(json.dumps({"repo": args.repo, "revision": args.revision, "namespace": namespace,
                          "checks": verdicts, "verdict": verdict}))  # fmt: skip
        return
    for check, each in verdicts.items():
        print(f"{check}: {each}")
    if not verdicts:
        what = f"check {args.check!r}" if args.check else "any check"
        print(f"no Evidence of {what} at {args.revision} of {args.repo} in namespace "
              f"{namespace}", file=sys.stderr)  # fmt: skip
    print(f"verdict: {verdict}")


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        _parser().print_help()
        return EXIT_OK if argv else EXIT_ERROR
    if argv[0] != "check":
        print(f"corral evidence: unknown verb {argv[0]!r}; use `corral evidence check`",
              file=sys.stderr)  # fmt: skip
        return EXIT_ERROR
    try:
        args = _parser().parse_args(argv[1:])
        if not _FULL_SHA.match(args.revision):
            raise _Usage("--revision must be the full 40-character lowercase SHA")
        wait_seconds = parse_duration(args.wait)
    except (_Usage, ValueError) as err:
        print(f"corral evidence check: {err}", file=sys.stderr)
        return EXIT_ERROR
    try:
        return asyncio.run(_check(args, wait_seconds))
    except Exception as exc:
        print(f"corral evidence check: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
