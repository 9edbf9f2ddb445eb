"""`corral approve NAME`, `corral deny NAME --reason TEXT` (docs/approvals.md); `corral get
approvals` lists them (get_cmd.py).

A person decides with their own kubeconfig: the decision is a write of the Approval's status
subresource, so RBAC (`update` on `approvals/status`) says who may decide, and the chart's
ValidatingAdmissionPolicy refuses a decision whose `status.decidedBy` is not the user making
the request. The command asks the API server who the caller is (a SelfSubjectReview) and writes
that name. Exit status: 0 decided, 1 decided already (by someone else, or before: nothing
written), 2 an error (bad usage, RBAC or admission refusing, no such approval, the API server
unreachable: `_errors`), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from ._cluster import add_cluster_options, connect, guarded, not_found, whoami
from ._errors import EXIT_OK, EXIT_OUTCOME, Parser, exit_epilog
from ._tables import describe_action

DECISIONS = {"approve": "Approved", "deny": "Denied"}  # corral_api.decisions' words


def build_parser(verb: str) -> argparse.ArgumentParser:
    p = Parser(
        prog=f"corral {verb}",
        description=(
            "Approve the exact call an Approval names: the waiting session replays it."
            if verb == "approve"
            else "Deny the exact call an Approval names: the waiting session is told so."
        ),
        epilog=exit_epilog("the approval was decided already (nothing written)"),
    )
    p.add_argument("name", help="the Approval's name (`corral get approvals`)")
    p.add_argument("--reason", default="", help="why; kept in status.comment")
    add_cluster_options(p)
    return p


async def _decide(verb: str, args: argparse.Namespace) -> int:
    kube, namespace = await connect(args)
    from corral_api.decisions import PENDING, approval_decision, decision_patch
    from corral_kube import MERGE_PATCH
    from corral_operator.kube import corral_path

    path = corral_path("Approval", namespace, args.name)
    try:
        approval = await kube.get(path)
        if approval is None:
            raise not_found("approvals", args.name, namespace)
        current = approval_decision(approval)
        if current != PENDING:
            print(f"corral {verb}: approval {args.name} is already {current}", file=sys.stderr)
            return EXIT_OUTCOME
        user = await whoami(kube)
        body = decision_patch(approval, DECISIONS[verb], user, args.reason, datetime.now(UTC))
        await kube.request("PATCH", f"{path}/status", body=body, content_type=MERGE_PATCH)
    finally:
        await kube.close()
    print(f"approval.corral.dev/{args.name} {DECISIONS[verb].lower()} by {user}: "
          f"{describe_action(approval, 120)}")  # fmt: skip
    return EXIT_OK


def decide_main(verb: str, argv: Sequence[str]) -> int:
    args = build_parser(verb).parse_args(list(argv))
    return guarded(verb, _decide(verb, args))
