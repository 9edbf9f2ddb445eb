"""`corral get sessions|goals|approvals|evidence [NAME]`: kubectl's tables for Corral's kinds,
read with the caller's own kubeconfig (docs/cli.md). Exit status: 0 listed, 2 anything else
(bad usage, the API server refusing or unreachable, NAME not there: `_errors`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import yaml

from ._cluster import add_cluster_options, connect, guarded, not_found, table
from ._errors import EXIT_OK, CommandError, Parser, exit_epilog, offer
from ._tables import KINDS, rows

# What `corral get` lists, by the names completion offers (KINDS takes short names too).
KIND_WORDS = ("sessions", "goals", "approvals", "evidence")

API = "/apis/corral.dev/v1alpha1"


def add_output_options(p: argparse.ArgumentParser, *, wide: bool = True) -> None:
    choices = ("table", "json", "yaml", "wide") if wide else ("table", "json", "yaml")
    p.add_argument("-o", "--output", choices=choices, default="table")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="corral get",
        description="List Sessions, Goals, Approvals or Evidence (or one by name).",
        epilog=exit_epilog(),
    )
    offer(
        p.add_argument("kind", help="sessions, goals, approvals or evidence (or a short name)"),
        KIND_WORDS,
    )
    p.add_argument("name", nargs="?", help="one object")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    p.add_argument("-l", "--selector", help="label selector, e.g. corral.dev/agent=coder")
    p.add_argument("--pending", action="store_true", help="approvals only: not decided yet")
    add_output_options(p)
    add_cluster_options(p)
    return p


def dump(items: list[dict[str, Any]], output: str, *, single: bool) -> str:
    """`-o json|yaml` as kubectl prints it: the object for a name, else a List."""
    doc: Any = items[0] if single else {"apiVersion": "v1", "kind": "List", "items": items}
    if output == "json":
        return json.dumps(doc, indent=2)
    return str(yaml.safe_dump(doc, sort_keys=False)).rstrip("\n")


async def _get(args: argparse.Namespace) -> int:
    kind, plural = KINDS[args.kind]
    if args.pending and kind != "Approval":
        raise CommandError("--pending is for approvals", "corral get approvals --pending")
    kube, namespace = await connect(args)
    from corral_api.decisions import PENDING, approval_decision
    from corral_operator.kube import corral_path

    try:
        if args.name:
            found = await kube.get(corral_path(kind, namespace, args.name))
            if found is None:
                raise not_found(plural, args.name, namespace)
            items = [found]
        else:
            path = f"{API}/{plural}" if args.all_namespaces else corral_path(kind, namespace)
            items = await kube.list(path, label_selector=args.selector)
    finally:
        await kube.close()
    if args.pending:
        items = [a for a in items if approval_decision(a) == PENDING]
    if args.output in ("json", "yaml"):
        print(dump(items, args.output, single=bool(args.name)))
    elif not items:
        where = "any namespace" if args.all_namespaces else f"{namespace} namespace"
        print(f"No resources found in {where}.", file=sys.stderr)
    else:
        wide = args.output == "wide"
        print(table(rows(kind, items, time.time(), wide=wide, namespaces=args.all_namespaces)))
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    p = build_parser()
    args = p.parse_args(list(argv))
    if args.kind not in KINDS:
        p.error(f"unknown kind {args.kind!r}: sessions, goals, approvals or evidence")
    if args.name and args.all_namespaces:
        p.error("a NAME is looked up in one namespace: drop -A")
    return guarded("get", _get(args))
