"""`corral tree NAME`: a Session and every Session it started, down the tree, with phases,
turns and cost (children are found by `spec.parentRef`, as the operator derives them)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.tree import Tree

from ._cluster import add_cluster_options, connect, guarded, not_found
from ._errors import EXIT_OK, Parser, exit_epilog, no_color
from ._tables import cost

Obj = dict[str, Any]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="corral tree", description=__doc__, epilog=exit_epilog())
    p.add_argument("name", help="the root Session")
    p.add_argument("-o", "--output", choices=("tree", "json"), default="tree")
    add_cluster_options(p)
    return p


def nest(root: Obj, sessions: list[Obj]) -> Obj:
    """{name, phase, turns, cost, children: [...]} from the root down; a cycle stops."""
    by_parent: dict[str, list[Obj]] = {}
    for s in sessions:
        parent = ((s.get("spec") or {}).get("parentRef") or {}).get("name")
        if parent:
            by_parent.setdefault(str(parent), []).append(s)
    seen: set[str] = set()

    def node(s: Obj) -> Obj:
        name = s["metadata"]["name"]
        seen.add(name)
        st = s.get("status") or {}
        kids = sorted(by_parent.get(name, []), key=lambda c: c["metadata"]["name"])
        return {
            "name": name,
            "phase": st.get("phase") or "Pending",
            "turns": st.get("turns") or 0,
            "cost": (st.get("usage") or {}).get("cost") or 0,
            "children": [node(c) for c in kids if c["metadata"]["name"] not in seen],
        }

    return node(root)


def render(tree: Obj) -> Tree:
    def grow(branch: Tree, node: Obj) -> None:
        for child in node["children"]:
            grow(branch.add(_line(child)), child)

    top = Tree(_line(tree))
    grow(top, tree)
    return top


def _line(node: Obj) -> str:
    return f"{node['name']}  {node['phase']}  turns {node['turns']}  {cost(node['cost'])}"


async def _tree(args: argparse.Namespace) -> int:
    kube, namespace = await connect(args)
    from corral_operator.kube import corral_path

    try:
        sessions = await kube.list(corral_path("Session", namespace))
    finally:
        await kube.close()
    root = next((s for s in sessions if s["metadata"]["name"] == args.name), None)
    if root is None:
        raise not_found("sessions", args.name, namespace)
    tree = nest(root, sessions)
    if args.output == "json":
        print(json.dumps(tree, indent=2))
    else:
        Console(highlight=False, color_system=None if no_color() else "auto").print(render(tree))
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    return guarded("tree", _tree(build_parser().parse_args(list(argv))))
