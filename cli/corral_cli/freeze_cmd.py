"""`corral freeze` / `corral unfreeze`: a person's switch over a session tree, an Agent's sessions
or a whole namespace (docs/freeze.md).

    corral freeze session NAME [-n NS] [--reason TEXT]
    corral freeze agent NAME [-n NS] [--reason TEXT]
    corral freeze namespace [-n NS] [--reason TEXT]
    corral unfreeze session NAME | agent NAME | namespace [-n NS] [--keep]

Each scope has one Freeze of a fixed name (`session-NAME`, `agent-NAME`, `namespace`), so
freezing twice updates the reason and unfreezing finds it. Unfreezing deletes it; `--keep`
sets `spec.frozen: false` instead, leaving the object for the record. The same works with
kubectl on the Freeze objects; the API server's RBAC decides who may do either.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

from ._cluster import add_cluster_options, connect
from ._errors import CommandError, Parser, exit_epilog

SCOPES = ("session", "agent", "namespace")
_NAME_LIMIT = 253


def freeze_name(scope: str, target: str | None) -> str:
    """The one Freeze name for a scope; long names keep a hash so two never collide."""
    if scope == "namespace":
        return "namespace"
    name = f"{scope}-{target}"
    if len(name) <= _NAME_LIMIT:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{name[: _NAME_LIMIT - 13].rstrip('-.')}-{digest}"


def freeze_manifest(scope: str, target: str | None, namespace: str, reason: str) -> dict[str, Any]:
    """The Freeze for `scope` (session|agent|namespace) in `namespace`."""
    from corral_api import API_VERSION

    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    if (scope == "namespace") != (target is None):
        raise ValueError(
            "freeze namespace takes no name (use -n)"
            if scope == "namespace"
            else f"freeze {scope} needs a name"
        )
    return {
        "apiVersion": API_VERSION,
        "kind": "Freeze",
        "metadata": {"name": freeze_name(scope, target), "namespace": namespace},
        "spec": {
            "scope": {scope: True} if scope == "namespace" else {scope: target},
            "frozen": True,
            "reason": reason,
        },
    }


def describe_scope(scope: str, target: str | None, namespace: str) -> str:
    if scope == "session":
        return f"session {target} and every session below it"
    if scope == "agent":
        return f"every session of agent {target} (and the sessions below them)"
    return f"every session in namespace {namespace}"


def build_parser(verb: str) -> argparse.ArgumentParser:
    p = Parser(
        prog=f"corral {verb}",
        epilog=exit_epilog(),
        description=(
            "Hold work: abort the turns in flight, admit nothing new, refuse model calls, "
            "pushes and spawns."
            if verb == "freeze"
            else "Lift a freeze: the held sessions continue their interrupted turns."
        ),
    )
    p.add_argument("scope", choices=SCOPES, help="what to hold: a session tree, an agent, all")
    p.add_argument("name", nargs="?", help="the Session or Agent (none for namespace)")
    add_cluster_options(p)
    if verb == "freeze":
        p.add_argument("--reason", default="", help="why; shown on every held Session")
    else:
        p.add_argument(
            "--keep", action="store_true", help="set spec.frozen=false instead of deleting"
        )
    return p


async def _run(verb: str, args: argparse.Namespace) -> int:
    kube, namespace = await connect(args)
    from corral_kube import MERGE_PATCH
    from corral_operator.kube import corral_path

    name = freeze_name(args.scope, args.name)
    path = corral_path("Freeze", namespace, name)
    what = describe_scope(args.scope, args.name, namespace)
    try:
        if verb == "freeze":
            manifest = freeze_manifest(args.scope, args.name, namespace, args.reason)
            if await kube.create(manifest):
                print(f"freeze.corral.dev/{name} created: {what} is frozen")
                return 0
            spec = {"frozen": True, "reason": args.reason}
            await kube.request("PATCH", path, body={"spec": spec}, content_type=MERGE_PATCH)
            print(f"freeze.corral.dev/{name} updated: {what} is frozen")
            return 0
        if args.keep:
            body = {"spec": {"frozen": False}}
            await kube.request("PATCH", path, body=body, content_type=MERGE_PATCH)
            print(f"freeze.corral.dev/{name} lifted (kept, frozen: false): {what} continues")
            return 0
        if not await kube.delete(path):
            raise CommandError(
                f'freezes "{name}" not found in namespace {namespace}: {what} is not frozen by it',
                f"`kubectl get freezes -n {namespace}` lists the freezes there are",
            )
        print(f"freeze.corral.dev/{name} deleted: {what} continues")
        return 0
    finally:
        await kube.close()


def main(verb: str, argv: Sequence[str]) -> int:
    parser = build_parser(verb)
    args = parser.parse_args(list(argv))
    try:
        freeze_manifest(args.scope, args.name, "check", "")
    except ValueError as err:
        parser.error(str(err))
    return asyncio.run(_run(verb, args))
