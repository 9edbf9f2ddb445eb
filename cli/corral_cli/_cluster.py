"""The cluster as `corral get/approve/deny/evidence` reach it: the caller's own kubeconfig.

Every command acts with the caller's credentials, so the API server's RBAC (and admission)
decides what they may do; nothing here holds or borrows another identity. A refusal
(`corral_kube.KubeRefused`) exits 1; an unreachable API server or an unusable kubeconfig is
unexpected and exits 2.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from corral_api import timestamps

EXIT_OK = 0
EXIT_REFUSED = 1  # the API server refused, or the object is not in a state to act on
EXIT_ERROR = 2  # bad usage, or anything unexpected

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")


async def connect(args: argparse.Namespace) -> tuple[Any, str]:
    """An API client for the caller's kubeconfig, and the namespace to act in (`-n`, else the
    context's)."""
    from corral_kube import load_kubeconfig
    from corral_operator.kube import Kube

    config = load_kubeconfig(args.kubeconfig, context=args.context)
    return Kube.of(config), args.namespace or config.namespace


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
    """kubectl's AGE column, `<unknown>` (as kubectl prints it) without a timestamp."""
    return timestamps.age(timestamp, now, unknown="<unknown>")


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
