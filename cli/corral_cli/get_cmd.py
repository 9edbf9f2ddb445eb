"""`corral get KIND [NAME]`: kubectl's `get` for Corral's kinds (sessions, agents, goals,
approvals, evidence, freezes), read with the caller's own kubeconfig (docs/cli.md). The table's
columns are the CRDs' printer columns; `-o name|json|yaml|wide|jsonpath=|custom-columns=`,
`-l`, `-A`, `--no-headers` and `-w` (the API server's watch) as kubectl has them. Exit status:
0 listed, 2 anything else (bad usage, the API server refusing or unreachable, NAME not there:
`_errors`); Ctrl-C ends a watch with 130."""

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
from ._jsonpath import JsonPathError, parse_columns, render_template
from ._tables import KINDS, custom_rows, resource_name, rows

# What `corral get` lists, by the names completion offers (KINDS takes short names too).
KIND_WORDS = ("sessions", "agents", "goals", "approvals", "evidence", "freezes")

API = "/apis/corral.dev/v1alpha1"
OUTPUTS = ("table", "wide", "name", "json", "yaml", "jsonpath=TEMPLATE", "custom-columns=SPEC")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="corral get",
        description="List Sessions, Agents, Goals, Approvals, Evidence or Freezes (or one by "
        "name), with the columns `kubectl get` shows.",
        epilog=exit_epilog(),
    )
    offer(
        p.add_argument(
            "kind", help="sessions, agents, goals, approvals, evidence or freezes (or a short name)"
        ),
        KIND_WORDS,
    )
    p.add_argument("name", nargs="?", help="one object")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    p.add_argument("-l", "--selector", help="label selector, e.g. corral.dev/agent=coder")
    p.add_argument("-w", "--watch", action="store_true", help="then print each change as it comes")
    p.add_argument("--no-headers", action="store_true", help="no header row in a table")
    p.add_argument("--pending", action="store_true", help="approvals only: not decided yet")
    offer(
        p.add_argument(
            "-o",
            "--output",
            default="table",
            help="name, json, yaml, wide, jsonpath=TEMPLATE ({.a.b}, [*], [0], "
            '[?(@.type=="Ready")], {range ...}{end}) or custom-columns=HEADER:PATH,...',
        ),
        ("name", "json", "yaml", "wide", "jsonpath=", "custom-columns="),
    )
    add_cluster_options(p)
    return p


class Output:
    """How `-o` prints objects: a table (plain, wide, custom columns), names, a document or a
    template. Checked before anything is fetched, so a bad `-o` is a usage error."""

    def __init__(self, kind: str, spec: str, *, namespaces: bool, headers: bool) -> None:
        self.kind = kind
        self.namespaces = namespaces
        self.headers = headers
        self.format, _, self.argument = spec.partition("=")
        self.columns: list[tuple[str, str]] = []
        if self.format not in ("table", "wide", "name", "json", "yaml", "jsonpath",
                               "custom-columns"):  # fmt: skip
            raise CommandError(
                f"-o {spec!r} is not an output format", f"one of: {', '.join(OUTPUTS)}"
            )
        if self.format in ("jsonpath", "custom-columns") and not self.argument:
            raise CommandError(f"-o {self.format}= needs its {self.format} after the '='")
        try:
            if self.format == "custom-columns":
                self.columns = parse_columns(self.argument)
            elif self.format == "jsonpath":
                render_template(self.argument, {})
        except JsonPathError as exc:
            raise CommandError(str(exc), "docs/cli.md lists the JSONPath corral reads") from None

    def table_rows(
        self, items: list[dict[str, Any]], now: float, *, header: bool
    ) -> list[list[str]]:
        if self.format == "custom-columns":
            return custom_rows(self.columns, items, header=header)
        return rows(self.kind, items, now, wide=self.format == "wide",
                    namespaces=self.namespaces, header=header)  # fmt: skip

    @property
    def tabular(self) -> bool:
        return self.format in ("table", "wide", "custom-columns")

    def listing(self, items: list[dict[str, Any]], *, single: bool, now: float) -> str | None:
        """The text for what was listed; None for an empty table (said on stderr instead)."""
        if self.format == "name":
            return "\n".join(resource_name(self.kind, o) for o in items) if items else None
        if self.format in ("json", "yaml"):
            return dump(items, self.format, single=single)
        if self.format == "jsonpath":
            doc: Any = items[0] if single else {"apiVersion": "v1", "kind": "List", "items": items}
            return render_template(self.argument, doc)
        if not items:
            return None
        return table(self.table_rows(items, now, header=self.headers))

    def change(self, obj: dict[str, Any], widths: list[int], now: float) -> str:
        """One watched change: a row padded to the table's widths, or the object alone."""
        if self.tabular:
            row = self.table_rows([obj], now, header=False)[0]
            cells = [c.ljust(w) for c, w in zip(row, widths, strict=False)] + row[len(widths) :]
            return "   ".join(cells).rstrip()
        if self.format == "name":
            return resource_name(self.kind, obj)
        if self.format == "json":
            return json.dumps(obj, indent=2)
        if self.format == "yaml":
            return "---\n" + str(yaml.safe_dump(obj, sort_keys=False)).rstrip("\n")
        return render_template(self.argument, obj)

    def widths(self, items: list[dict[str, Any]], now: float) -> list[int]:
        if not self.tabular:
            return []
        shown = self.table_rows(items, now, header=True)
        return [max(len(r[i]) for r in shown) for i in range(len(shown[0]))]


def dump(items: list[dict[str, Any]], output: str, *, single: bool) -> str:
    """`-o json|yaml` as kubectl prints it: the object for a name, else a List."""
    doc: Any = items[0] if single else {"apiVersion": "v1", "kind": "List", "items": items}
    if output == "json":
        return json.dumps(doc, indent=2)
    return str(yaml.safe_dump(doc, sort_keys=False)).rstrip("\n")


def _keep(args: argparse.Namespace, obj: dict[str, Any]) -> bool:
    """What a watch prints: the named object only, undecided Approvals only with --pending."""
    if args.name and obj.get("metadata", {}).get("name") != args.name:
        return False
    if args.pending:
        from corral_api.decisions import PENDING, approval_decision

        return bool(approval_decision(obj) == PENDING)
    return True


async def _watch(
    kube: Any, path: str, version: str, args: argparse.Namespace, out: Output, widths: list[int]
) -> None:
    """Print each change after `version` until interrupted; a watch the server ends is taken
    up again from the last version seen, and an expired version lists again (as kubectl)."""
    from corral_kube import Gone

    while True:
        try:
            async for event in kube.client.watch(path, version, label_selector=args.selector):
                obj = event.get("object") or {}
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if event.get("type") == "BOOKMARK" or not _keep(args, obj):
                    continue
                print(out.change(obj, widths, time.time()), flush=True)
        except Gone:
            found = await kube.request("GET", path, query=_query(args))
            version = str(((found or {}).get("metadata") or {}).get("resourceVersion") or "")


def _query(args: argparse.Namespace) -> dict[str, str] | None:
    return {"labelSelector": args.selector} if args.selector else None


async def _get(args: argparse.Namespace) -> int:
    kind, plural = KINDS[args.kind]
    if args.pending and kind != "Approval":
        raise CommandError("--pending is for approvals", "corral get approvals --pending")
    out = Output(kind, args.output, namespaces=args.all_namespaces, headers=not args.no_headers)
    kube, namespace = await connect(args)
    from corral_api.decisions import PENDING, approval_decision
    from corral_operator.kube import corral_path

    collection = f"{API}/{plural}" if args.all_namespaces else corral_path(kind, namespace)
    try:
        if args.name:
            found = await kube.get(corral_path(kind, namespace, args.name))
            if found is None:
                raise not_found(plural, args.name, namespace)
            items = [found]
            version = str(found["metadata"].get("resourceVersion") or "")
        else:
            listed = await kube.request("GET", collection, query=_query(args))
            items = list((listed or {}).get("items") or [])
            version = str(((listed or {}).get("metadata") or {}).get("resourceVersion") or "")
        if args.pending:
            items = [a for a in items if approval_decision(a) == PENDING]
        now = time.time()
        text = out.listing(items, single=bool(args.name), now=now)
        if text is None:
            where = "any namespace" if args.all_namespaces else f"{namespace} namespace"
            print(f"No resources found in {where}.", file=sys.stderr)
        else:
            print(text, flush=True)
        if args.watch:
            await _watch(kube, collection, version, args, out, out.widths(items, now))
    finally:
        await kube.close()
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    p = build_parser()
    args = p.parse_args(list(argv))
    if args.kind not in KINDS:
        p.error(f"unknown kind {args.kind!r}: {', '.join(KIND_WORDS)} (or their short names)")
    if args.name and args.all_namespaces:
        p.error("a NAME is looked up in one namespace: drop -A")
    return guarded("get", _get(args))
