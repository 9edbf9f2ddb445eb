"""Corral on a cluster of real containers: the chart installed with `helm install`, and what a
sandbox reaches on this host (a git daemon, the scripted model), served on the address pods
reach this host by.

Shared by `python -m corral_dev up --node real` and the node tier (tests/node), which also runs
against kind (hack/e2e-kind.sh). On the real node that address is this host's end of the link
to the node's network namespace (198.18.(128+slot).1): nothing here listens on a private range,
and nothing listens on every address.

A sandbox leaves only through the chart's egress gateway (docs/egress.md): the custodian
reaches the model and the git daemon there with its proxy credential, the agent only what its
Agent names. The gateway refuses this host's address as a private one unless told otherwise, so
an install names it in `egressGateway.allowRanges`, and names that tests resolve in
`egressGateway.hosts`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .controlplane import REPO_ROOT
from .ports import free_port as free_port  # re-exported: the dev cluster and node tier call it
from .stack import without_credentials

CHART = REPO_ROOT / "charts" / "corral"
OPERATOR_NAMESPACE = "corral-system"


class StackError(Exception):
    """A part of Corral on the cluster did not come up."""


def split_image(ref: str) -> tuple[str, str]:
    """`registry:port/name:tag` -> (`registry:port/name`, `tag`); a ref without a tag -> latest."""
    name, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return name, tag


def chart_values(
    *,
    operator_image: str,
    sandbox_image: str,
    namespaces: Sequence[str],
    model_url: str,
    platform_egress: Sequence[str] = (),
    wire_wait_seconds: float | None = None,
    gateway_allow: Sequence[str] = (),
    gateway_hosts: Mapping[str, Sequence[str]] | None = None,
    archive_claim: str | None = None,
) -> dict[str, Any]:
    """The values for an install whose images are already on the node (pulled never);
    `archive_claim`: a PersistentVolumeClaim made for the archive (`archive_volume`)."""
    repository, tag = split_image(operator_image)
    values: dict[str, Any] = {
        "image.repository": repository,
        "image.tag": tag,
        "image.pullPolicy": "IfNotPresent",
        "sandboxImage": sandbox_image,
        "watchNamespaces": list(namespaces),
        "sandbox.modelUpstreamUrl": model_url,
        "sandbox.platformEgress": list(platform_egress),
        # The local node has no volume provisioner for the archive's claim (docs/history.md):
        # without a claim made for it (`archive_volume`) the install archives nothing.
        "archive.enabled": archive_claim is not None,
    }
    if archive_claim is not None:
        values["archive.existingClaim"] = archive_claim
    if wire_wait_seconds is not None:
        values["operator.wireWaitSeconds"] = wire_wait_seconds
    if gateway_allow:
        values["egressGateway.allowRanges"] = list(gateway_allow)
    if gateway_hosts:
        values["egressGateway.hosts"] = {k: list(v) for k, v in gateway_hosts.items()}
    return values


def helm_install(
    helm: Path,
    kubeconfig: Path,
    release: str,
    values: Mapping[str, Any],
    *,
    namespace: str = OPERATOR_NAMESPACE,
    timeout: float = 240,
    operator_args: Sequence[str] = (),
    reuse_values: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`helm upgrade --install --wait` of the chart; StackError with helm's words on failure.
    `operator_args`: more arguments for the operator, which the chart has no value for (the dev
    cluster's `--local-repo-root`), added by a post-renderer (corral_dev._helm_postrender).
    `reuse_values`: the release's values with `values` over them (`--reuse-values`, the upgrade
    docs/operations.md describes), not the chart's defaults with `values` alone."""
    args = [
        str(helm),
        "upgrade",
        "--install",
        release,
        str(CHART),
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        namespace,
        "--create-namespace",
        "--wait",
        "--timeout",
        f"{int(timeout)}s",
    ]
    if reuse_values:
        args.append("--reuse-values")
    for key, value in values.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    if operator_args:
        args += ["--post-renderer", sys.executable]
        renderer = ["-m", "corral_dev._helm_postrender"]
        renderer += [f"--operator-arg={arg}" for arg in operator_args]
        args += [f"--post-renderer-args={arg}" for arg in renderer]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout + 60, check=False)
    if done.returncode != 0:
        raise StackError(f"helm install failed (exit {done.returncode}):\n{done.stderr.strip()}")
    return done


def wait_listening(
    what: str,
    host: str,
    port: int,
    process: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    timeout: float = 30,
) -> None:
    """Wait until host:port accepts a connection; fail early, with the log's tail, if
    `process` exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            pass
        exited = process is not None and process.poll() is not None
        if exited or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            state = "exited" if exited else f"not listening on {host}:{port} after {timeout:.0f}s"
            raise StackError(f"{what} {state}\n{tail}")
        time.sleep(0.1)


def spawn(
    argv: list[str], log: Path | None, *, detach: bool, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") if log is not None else open("/dev/null", "wb") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=without_credentials(os.environ),
            start_new_session=detach,
        )


def start_git_daemon(
    base: Path, host: str, port: int, log: Path | None = None, *, detach: bool = False
) -> subprocess.Popen[bytes]:
    """`git daemon` serving every repository under `base` as git://host:port/<path>, clones
    and pushes (a session's push goes to its own branch). It has no authentication: serve only
    test and demo repositories, on an address only this host and its pods reach."""
    argv = [
        "git",
        "daemon",
        "--reuseaddr",
        f"--listen={host}",
        f"--port={port}",
        f"--base-path={base}",
        "--export-all",
        "--enable=receive-pack",
        "--informative-errors",
        str(base),
    ]
    proc = spawn(argv, log, detach=detach)
    wait_listening("git daemon", host, port, proc, log)
    return proc


def start_scripted_model(
    host: str, port: int, script: Path, log: Path | None = None, *, detach: bool = False
) -> subprocess.Popen[bytes]:
    """The project's scripted model (`python -m corral_dev.scripted`) on host:port."""
    argv = [
        sys.executable,
        "-m",
        "corral_dev.scripted",
        "--host",
        host,
        "--port",
        str(port),
        "--script",
        str(script),
    ]
    proc = spawn(argv, log, detach=detach)
    wait_listening("the scripted model", host, port, proc, log, timeout=60)
    return proc


def git_repository(
    path: Path, files: Mapping[str, str] | None = None, *, source: Path | None = None
) -> Path:
    """A git repository at `path` with one commit on `main`: `files`, or a copy of `source`."""
    import shutil

    if source is not None:
        shutil.copytree(
            source, path, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True
        )
    path.mkdir(parents=True, exist_ok=True)
    for name, text in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git = [
        "git",
        "-c",
        "user.name=Corral",
        "-c",
        "user.email=corral@corral.invalid",
        "-c",
        "commit.gpgsign=false",
    ]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "init"]):
        subprocess.run([*git, *args], cwd=path, check=True, capture_output=True)
    return path


def archive_volume(name: str, namespace: str, directory: Path, owner: int) -> list[dict[str, Any]]:
    """A hostPath PersistentVolume at `directory` on the (single, local) node, pre-bound to a
    claim `name` in `namespace`, for the chart's `archive.existingClaim`: the local node has no
    volume provisioner. The directory is made and given to the operator's uid (`owner`), since
    fsGroup does not apply to hostPath volumes."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chown(directory, owner, owner)
    directory.chmod(0o770)
    claim_ref = {"namespace": namespace, "name": name}
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{namespace}-{name}"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(directory), "type": "Directory"},
                "claimRef": claim_ref,
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": f"{namespace}-{name}",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]
