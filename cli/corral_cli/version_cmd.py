"""`corral version` (also `corral --version`): this client's version, from its package's
metadata, and, when the kubeconfig's cluster answers, the versions its Corral CRDs serve and
store (read from the CRD objects) and the operator's image (its Deployment in the chart's
namespace). A cluster that cannot be read is a line that says why, not a failure: the client's
version is what was asked first, so the exit status is 0 (2 only for bad usage).

    corral version [--client] [-o text|json] [--operator-namespace NS] [--kubeconfig FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from ._cluster import add_cluster_options, load_config
from ._errors import EXIT_OK, Parser, explain

DISTRIBUTION = "corral"
# The chart installs into this namespace in docs/operations.md, and labels its operator so.
OPERATOR_NAMESPACE = "corral-system"
OPERATOR_SELECTOR = "app.kubernetes.io/name=corral-operator"
VERSION_LABEL = "app.kubernetes.io/version"
# A version is a quick question: a cluster slower than this to answer is reported as such.
SERVER_TIMEOUT = 5.0

Obj = dict[str, Any]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="corral version",
        description="Print the client's version and, when reachable, the cluster's Corral CRD "
        "versions and operator image.",
        epilog="exit status: 0 done (a cluster that cannot be read is reported, and is not an "
        "error), 2 bad usage",
    )
    p.add_argument("--client", action="store_true", help="the client's version only")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.add_argument(
        "--operator-namespace",
        default=OPERATOR_NAMESPACE,
        help=f"where the chart installed the operator (default {OPERATOR_NAMESPACE})",
    )
    add_cluster_options(p)
    return p


def client_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "unknown (not installed as a package)"


def _why(exc: BaseException) -> str:
    found = explain(exc)
    return found[0] if found is not None else f"{type(exc).__name__}: {exc}"


def crd_versions(crd: Obj) -> Obj:
    """The versions a CRD serves, the one it stores new objects as, and those stored so far."""
    versions = (crd.get("spec") or {}).get("versions") or []
    return {
        "served": [str(v.get("name")) for v in versions if v.get("served")],
        "storage": next((str(v.get("name")) for v in versions if v.get("storage")), None),
        "storedVersions": list((crd.get("status") or {}).get("storedVersions") or []),
    }


def operator_summary(deployment: Obj) -> Obj:
    md, spec = deployment.get("metadata") or {}, deployment.get("spec") or {}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    image = next((c.get("image") for c in containers if c.get("name") == "operator"), None)
    status = deployment.get("status") or {}
    return {
        "name": md.get("name"),
        "image": image or (containers[0].get("image") if containers else None),
        "version": (md.get("labels") or {}).get(VERSION_LABEL),
        "ready": f"{status.get('readyReplicas') or 0}/{spec.get('replicas', 1)}",
    }


async def _crd(kube: Any, name: str) -> Obj:
    from corral_kube import KubeError

    try:
        crd = await kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    except KubeError as exc:
        return {"error": _why(exc)}
    return {"error": "not installed"} if crd is None else crd_versions(crd)


async def server_info(args: argparse.Namespace) -> Obj:
    """What the cluster says about Corral; `{"error": why}` when it cannot be asked."""
    from corral_api import GROUP, KINDS
    from corral_kube import KubeClient, KubeError, KubeRefused

    try:
        config = load_config(args)
    except Exception as exc:
        return {"error": _why(exc)}
    kube = KubeClient(config, timeout=SERVER_TIMEOUT)
    try:
        try:
            found = await kube.request("GET", "/version")
            kubernetes = str(found.get("gitVersion")) if isinstance(found, dict) else "unknown"
        except KubeRefused as exc:  # it answers; its version is not for this identity
            kubernetes = f"unknown: {_why(exc)}"
        except KubeError as exc:
            return {"server": config.server, "error": _why(exc)}
        names = [f"{kind.info.plural}.{GROUP}" for kind in KINDS]
        crds = await asyncio.gather(*(_crd(kube, name) for name in names))
        info: Obj = {
            "server": config.server,
            "kubernetes": kubernetes,
            "crds": dict(zip(names, crds, strict=True)),
        }
        ns = args.operator_namespace
        try:
            listed = await kube.list(
                f"/apis/apps/v1/namespaces/{ns}/deployments", label_selector=OPERATOR_SELECTOR
            )
        except KubeError as exc:
            info["operator"] = {"namespace": ns, "error": _why(exc)}
        else:
            info["operator"] = (
                {"namespace": ns, **operator_summary(listed[0])}
                if listed
                else {"namespace": ns, "error": f"no operator Deployment in namespace {ns}"}
            )
        return info
    finally:
        await kube.aclose()


def render(client: str, server: Obj | None) -> str:
    lines = [f"Client Version: corral {client}"]
    if server is None:
        return lines[0]
    if "kubernetes" not in server:
        at = f" at {server['server']}" if server.get("server") else ""
        lines.append(f"Server: unreachable{at} ({server.get('error')})")
        return "\n".join(lines)
    lines.append(f"Server: {server['server']} (Kubernetes {server.get('kubernetes')})")
    crds = server["crds"]
    errors = [crd["error"] for crd in crds.values() if "error" in crd]
    if (
        len(errors) == len(crds)
        and len({e.split(":", 1)[0] for e in errors}) == 1
        and (errors[0] != "not installed")
    ):  # the same refusal for each (RBAC on CRDs is cluster-wide): said once
        lines.append(f"CRDs: {errors[0]}")
        crds = {}
    for name, crd in crds.items():
        if "error" in crd:
            lines.append(f"CRD {name}: {crd['error']}")
        else:
            lines.append(
                f"CRD {name}: served {', '.join(crd['served']) or 'none'}, storage "
                f"{crd['storage']}, stored {', '.join(crd['storedVersions']) or 'none'}"
            )
    op = server["operator"]
    if "error" in op:
        lines.append(f"Operator: {op['error']}")
    else:
        version = f" version {op['version']}" if op.get("version") else ""
        lines.append(f"Operator: {op['namespace']}/{op['name']} image {op['image']}{version} "
                     f"(ready {op['ready']})")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    client = client_version()
    server = None if args.client else asyncio.run(server_info(args))
    if args.output == "json":
        print(json.dumps({"client": {"version": client}, **({"server": server} if server else {})}))
    else:
        print(render(client, server))
    return EXIT_OK
