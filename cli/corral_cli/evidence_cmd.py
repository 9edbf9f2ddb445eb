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

from ._cluster import add_cluster_options, connect, parse_duration
from ._errors import EXIT_ERROR, EXIT_OK, Parser, offer

EXIT_FAIL = 1
EXIT_PENDING = 3
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
_POLL_SECONDS = 2.0
VERBS = ("check",)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="corral evidence",
        description="Print the Evidence verdict at a revision and exit by it (a CI gate).",
        epilog="exit status: 0 Pass, 1 Fail, 2 an error (no such check, a check that could not "
        "run, bad usage, no kubeconfig, the API server unreachable or refusing), 3 still "
        "pending when the wait ran out, 130 interrupted",
    )
    offer(p.add_argument("verb", choices=VERBS, help="check: the gate"), VERBS)
    p.add_argument("--repo", required=True, help="the repository URL, exactly as the Session's "
                   "spec.workspace.repo names it")  # fmt: skip
    p.add_argument("--revision", required=True, help="the full 40-character commit SHA")
    p.add_argument("--check", help="only this check (default: every check at the revision)")
    p.add_argument("--wait", default="0", help="wait up to this long for a verdict: 90s, 10m")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    add_cluster_options(p)
    return p


def selector(repo: str, revision: str, check: str | None) -> str:
    from corral_api.labels import EVIDENCE_CHECK, EVIDENCE_REPO, EVIDENCE_REVISION, repo_hash

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
    kube, namespace = await connect(args)
    from corral_api.evidence import verdicts_at
    from corral_operator.kube import corral_path

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
    parser = build_parser()
    if not argv:
        parser.print_help()
        return EXIT_ERROR
    args = parser.parse_args(argv)
    if not _FULL_SHA.match(args.revision):
        parser.error("--revision must be the full 40-character lowercase SHA")
    try:
        wait_seconds = parse_duration(args.wait)
    except ValueError as err:
        parser.error(f"--wait: {err}")
    return asyncio.run(_check(args, wait_seconds))
