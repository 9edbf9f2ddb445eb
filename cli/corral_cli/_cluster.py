"""The cluster as `corral get/approve/deny/evidence` reach it: the caller's own kubeconfig.

Every command acts with the caller's credentials, so the API server's RBAC (and admission)
decides what they may do; nothing here holds or borrows another identity.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

EXIT_OK = 0
EXIT_REFUSED = 1  # the API server refused, or the object is not in a state to act on
EXIT_ERROR = 2  # bad usage, or anything unexpected

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")


async def connect(args: argparse.Namespace) -> tuple[Any, str]:
    """An API client for the caller's kubeconfig, and the namespace to act in."""
    from kubernetes_asyncio import client, config

    from corral_operator.kube import Kube

    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=args.kubeconfig, context=args.context, client_configuration=configuration
    )
    contexts, active = config.list_kube_config_contexts(args.kubeconfig)
    chosen = (
        next((c for c in contexts if c.get("name") == args.context), None)
        if args.context
        else active
    )
    namespace = str(((chosen or {}).get("context") or {}).get("namespace") or "default")
    return Kube(client.ApiClient(configuration)), args.namespace or namespace


async def whoami(kube: Any) -> str:
    """The caller's user name as the API server authenticates it (a SelfSubjectReview)."""
    review = await kube.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    name = ((review or {}).get("status") or {}).get("userInfo", {}).get("username")
    if not isinstance(name, str) or not name:
        raise ValueError("the API server did not say who you are (SelfSubjectReview)")
    return name


def parse_duration(text: str) -> float:
    """Seconds in `90`, `90s`, `10m`, `1h30m`; a ValueError otherwise."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 10m, 1h30m)")
    hours, minutes, seconds = match.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)


def age(timestamp: str | None, now: float) -> str:
    """kubectl's AGE column: 45s, 3m, 2h, 4d."""
    if not timestamp:
        return "<unknown>"
    from datetime import datetime

    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "<unknown>"
    seconds = max(0, int(now - then))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
