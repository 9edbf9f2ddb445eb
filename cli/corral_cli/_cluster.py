"""The cluster as `corral get/approve/deny/evidence` reach it: the caller's own kubeconfig.

Every command acts with the caller's credentials, so the API server's RBAC (and admission)
decides what they may do; nothing here holds or borrows another identity. A missing or unusable
kubeconfig, an unreachable API server, a refusal (`corral_kube.KubeRefused`) and a missing
object all exit 2 with what to do (`_errors`, docs/cli.md); 1 is only a command's own outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from collections.abc import Coroutine
from typing import Any

from ._errors import CommandError

# A request to the API server gives up after this long (kubectl waits ~30 s to connect): a
# blackholed server is an error to report, not a command that hangs.
REQUEST_TIMEOUT = 30.0

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")


def load_config(args: argparse.Namespace) -> Any:
    """The caller's kubeconfig (`--kubeconfig`, else $KUBECONFIG's files, else ~/.kube/config);
    a CommandError that names the files when none of them exists."""
    from corral_kube import kubeconfig_paths, load_kubeconfig

    paths = kubeconfig_paths(args.kubeconfig)
    if not any(path.exists() for path in paths):
        named = ", ".join(str(p) for p in paths)
        given = "--kubeconfig" if args.kubeconfig else "$KUBECONFIG" if os.environ.get(
            "KUBECONFIG") else "the default kubeconfig"  # fmt: skip
        raise CommandError(
            f"no kubeconfig: {given} {named} does not exist",
            "point $KUBECONFIG or --kubeconfig at your cluster's kubeconfig "
            "(`kubectl config view` shows the one kubectl uses)",
        )
    return load_kubeconfig(args.kubeconfig, context=args.context)


async def connect(args: argparse.Namespace) -> tuple[Any, str]:
    """An API client for the caller's kubeconfig, and the namespace to act in (`-n`, else the
    context's). The operator's modules (and the API's models) are imported after the kubeconfig
    is read, here and in the commands, so a missing one is told without their import."""
    config = load_config(args)
    from corral_kube import KubeClient
    from corral_operator.kube import Kube

    return Kube(KubeClient(config, timeout=REQUEST_TIMEOUT)), args.namespace or config.namespace


def not_found(plural: str, name: str, namespace: str) -> CommandError:
    """A missing object, in kubectl's words, and where to look for the ones there are."""
    return CommandError(
        f'{plural} "{name}" not found in namespace {namespace}',
        f"`corral get {plural} -n {namespace}` lists the ones there are",
    )


async def whoami(kube: Any) -> str:
    """The caller's user name as the API server authenticates it (a SelfSubjectReview)."""
    review = await kube.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    name = ((review or {}).get("status") or {}).get("userInfo", {}).get("username")
    if not isinstance(name, str) or not name:
        raise CommandError(
            "the API server did not say who you are (SelfSubjectReview)",
            "a decision is recorded in your name: use a kubeconfig whose user the API server "
            "authenticates",
        )
    return name


def guarded(what: str, work: Coroutine[Any, Any, int]) -> int:
    """The command's coroutine, run to its exit status. What it raises is main's guard's to
    explain (`_errors.guard`): a line or two and exit 2, never a traceback."""
    del what  # main's guard names the command
    return int(asyncio.run(work))


def parse_duration(text: str) -> float:
    """Seconds in `90`, `90s`, `10m`, `1h30m`; a ValueError otherwise."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 10m, 1h30m)")
    hours, minutes, seconds = match.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)


def age(timestamp: str | None, now: float) -> str:
    """kubectl's AGE column, `<unknown>` (as kubectl prints it) without a timestamp."""
    from corral_api import timestamps  # imported when a table is drawn, not for `--help`

    return timestamps.age(timestamp, now, unknown="<unknown>")


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )
