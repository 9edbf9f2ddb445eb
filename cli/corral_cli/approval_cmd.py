"""`corral get approvals`, `corral approve NAME`, `corral deny NAME --reason TEXT`
(docs/approvals.md).

A person decides with their own kubeconfig: the decision is a write of the Approval's status
subresource, so RBAC (`update` on `approvals/status`) says who may decide, and the chart's
ValidatingAdmissionPolicy refuses a decision whose `status.decidedBy` is not the user making
the request. The command asks the API server who the caller is (a SelfSubjectReview) and writes
that name. Exit status: 0 decided (or listed), 1 refused (RBAC, admission, not found, already
decided), 2 bad usage or an unexpected error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from corral_api.decisions import decision_status

from ._cluster import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_REFUSED,
    add_cluster_options,
    age,
    connect,
    table,
    whoami,
)

DECISIONS = {"approve": "Approved", "deny": "Denied"}


def describe_action(approval: dict[str, Any], width: int = 60) -> str:
    action = (approval.get("spec") or {}).get("action") or {}
    text = f"{action.get('tool', '?')} {action.get('arguments', '{}')}"
    return text if len(text) <= width else text[: width - 1] + "…"


def approval_rows(approvals: list[dict[str, Any]], now: float) -> list[list[str]]:
    rows = [["NAME", "SESSION", "ACTION", "DECISION", "DECIDED BY", "AGE"]]
    for a in sorted(approvals, key=lambda a: a["metadata"].get("creationTimestamp", "")):
        status = a.get("status") or {}
        rows.append(
            [
                a["metadata"]["name"],
                str(((a.get("spec") or {}).get("sessionRef") or {}).get("name", "")),
                describe_action(a),
                str(status.get("decision") or "Pending"),
                str(status.get("decidedBy") or ""),
                age(a["metadata"].get("creationTimestamp"), now),
            ]
        )
    return rows


def _get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="corral get approvals",
        description="List Approvals (or one): the session, the exact call, the decision.",
    )
    p.add_argument("name", nargs="?", help="one Approval")
    p.add_argument("--pending", action="store_true", help="only those not decided yet")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    add_cluster_options(p)
    return p


def _decide_parser(verb: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"corral {verb}",
        description=(
            "Approve the exact call an Approval names: the waiting session replays it."
            if verb == "approve"
            else "Deny the exact call an Approval names: the waiting session is told so."
        ),
        epilog="exit status: 0 decided, 1 refused (RBAC, admission, not found, already "
        "decided), 2 bad usage or an unexpected error",
    )
    p.add_argument("name", help="the Approval's name (`corral get approvals`)")
    p.add_argument("--reason", default="", help="why; kept in status.comment")
    add_cluster_options(p)
    return p


async def _get(args: argparse.Namespace) -> int:
    from corral_operator.kube import KubeError, corral_path

    kube, namespace = await connect(args)
    try:
        if args.name:
            found = await kube.get(corral_path("Approval", namespace, args.name))
            if found is None:
                print(f"corral: approval {args.name!r} not found in {namespace}", file=sys.stderr)
                return EXIT_REFUSED
            items = [found]
        else:
            items = await kube.list(corral_path("Approval", namespace))
    except KubeError as err:
        print(f"corral get approvals: the API server refused: {err.reason}", file=sys.stderr)
        return EXIT_REFUSED
    finally:
        await kube.close()
    if args.pending:
        items = [a for a in items if (a.get("status") or {}).get("decision") in (None, "Pending")]
    if args.output == "json":
        print(json.dumps({"items": items}, indent=2))
    elif not items:
        print(f"No approvals found in {namespace} namespace.", file=sys.stderr)
    else:
        print(table(approval_rows(items, time.time())))
    return EXIT_OK


async def _decide(verb: str, args: argparse.Namespace) -> int:
    from corral_operator.kube import MERGE_PATCH, KubeError, corral_path

    kube, namespace = await connect(args)
    path = corral_path("Approval", namespace, args.name)
    try:
        approval = await kube.get(path)
        if approval is None:
            print(
                f"corral {verb}: approval {args.name!r} not found in {namespace}", file=sys.stderr
            )
            return EXIT_REFUSED
        current = (approval.get("status") or {}).get("decision") or "Pending"
        if current != "Pending":
            print(f"corral {verb}: approval {args.name} is already {current}", file=sys.stderr)
            return EXIT_REFUSED
        user = await whoami(kube)
        status = decision_status(DECISIONS[verb], user, args.reason, datetime.now(UTC))
        # The resourceVersion makes it a compare-and-swap: a decision someone wrote meanwhile
        # is not overwritten (and a decision is final anyway: the schema's CEL rule).
        body = {
            "metadata": {"resourceVersion": approval["metadata"]["resourceVersion"]},
            "status": status,
        }
        await kube.request("PATCH", f"{path}/status", body=body, content_type=MERGE_PATCH)
    except KubeError as err:
        print(f"corral {verb}: the API server refused: {err.reason}", file=sys.stderr)
        return EXIT_REFUSED
    finally:
        await kube.close()
    print(f"approval.corral.dev/{args.name} {DECISIONS[verb].lower()} by {user}: "
          f"{describe_action(approval, 120)}")  # fmt: skip
    return EXIT_OK


def get_main(argv: Sequence[str]) -> int:
    args = _get_parser().parse_args(list(argv))
    return _guarded("get approvals", _get(args))


def decide_main(verb: str, argv: Sequence[str]) -> int:
    args = _decide_parser(verb).parse_args(list(argv))
    return _guarded(verb, _decide(verb, args))


def _guarded(what: str, work: Any) -> int:
    """Any unexpected error exits 2 with its message, never a traceback and never 1."""
    try:
        return int(asyncio.run(work))
    except Exception as exc:
        print(f"corral {what}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
