"""What the local node's host gives a container process: who may switch users, what is hidden,
what is shared back, and the spec `_node_sandbox` starts the process from.

As root, each container process starts through `_node_sandbox` in its own mount namespace
where the node's workdir (every pod's volumes), /root (the cluster's kubeconfigs and caches),
the control plane's state directory and the world-writable /tmp, /var/tmp, /dev/shm and
/run/lock are behind fresh tmpfs mounts, and only this container's volumes, its HOME, the Python
installation, the venv, the project's sources, the exec service's binary and the directories
shared with `--share` (idmapped, so the container's user owns what root owns there) are bound
back. Not as root, processes run as the node's user with no isolation, and a pod asking for
another user is refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._node_spec import CAPABILITIES, SHARED_TMP_DIRS, ContainerSecurity, MountOp, mount_plan

log = logging.getLogger("corral.localnode")
REPO_ROOT = Path(__file__).resolve().parents[2]
SANDBOX = Path(__file__).with_name("_node_sandbox.py")
SHARE_ENV = "CORRAL_NODE_SHARE"  # more read-only shared directories, os.pathsep-separated


def shares_from_env(environ: dict[str, str] | None = None) -> list[Path]:
    value = (environ if environ is not None else dict(os.environ)).get(SHARE_ENV, "")
    return [Path(p) for p in value.split(os.pathsep) if p]


def _exec_binary_dir() -> Path | None:
    """The directory of the exec service's binary (`corral-exec`), from corral_dev.execbin."""
    try:
        execbin = importlib.import_module("corral_dev.execbin")
    except ModuleNotFoundError as e:
        if e.name != "corral_dev.execbin":
            raise
        return None
    return Path(execbin.exec_binary()).resolve().parent


_lookup: concurrent.futures.Future[Path | None] | None = None
_lookup_lock = threading.Lock()


def _exec_lookup() -> concurrent.futures.Future[Path | None]:
    """One lookup per process, in a daemon thread: a build in progress never holds up a node
    that stops, nor a container whose command is found without it."""
    global _lookup
    with _lookup_lock:
        if _lookup is None:
            future: concurrent.futures.Future[Path | None] = concurrent.futures.Future()

            def run() -> None:
                try:
                    future.set_result(_exec_binary_dir())
                except Exception as e:  # a failed build must not stop the node
                    log.warning("the exec service's binary is unavailable: %s", e)
                    future.set_exception(e)

            threading.Thread(target=run, name="corral-exec lookup", daemon=True).start()
            _lookup = future
        return _lookup


@dataclass
class NodeHost:
    workdir: Path
    venv_bin: Path
    kubeconfig: Path | None = None
    shares: list[Path] = field(default_factory=list)
    root: bool = field(default_factory=lambda: os.geteuid() == 0)

    @property
    def uid(self) -> int:
        return os.geteuid()

    @property
    def gid(self) -> int:
        return os.getegid()

    def start(self) -> None:
        """Find the exec service's binary in the background (it may be built on first use)."""
        _exec_lookup()

    def exec_dir_now(self) -> Path | None:
        """The exec binary's directory if it is known by now (it then goes on every PATH)."""
        lookup = _exec_lookup()
        if lookup.done() and lookup.exception() is None:
            return lookup.result()
        return None

    async def exec_dir(self) -> Path | None:
        """The exec binary's directory, waiting for the lookup (for a command not found)."""
        try:
            return await asyncio.wrap_future(_exec_lookup())
        except Exception:
            return None

    def missing_hint(self) -> str:
        lookup = _exec_lookup()
        if not lookup.done():
            return ""
        error = lookup.exception()
        if error is not None:
            return f" (corral_dev.execbin.exec_binary() failed: {error})"
        if lookup.result() is None:
            return (
                " (corral_dev.execbin is missing, so the exec service's binary, corral-exec, "
                "is not on the containers' PATH)"
            )
        return ""

    # ------------------------------------------------------------------------------- layout

    def hidden(self) -> list[str]:
        hide = [str(self.workdir.resolve()), "/root", str(Path.home())]
        hide += [d for d in SHARED_TMP_DIRS if os.path.isdir(d)]  # each container its own
        if self.kubeconfig is not None:
            hide.append(str(self.kubeconfig.resolve().parent))  # the cluster's keys
        return hide

    def runtime_shares(self, exec_dir: Path | None) -> list[str]:
        """What every process needs from the host: Python, the venv, the sources, binaries."""
        paths = [
            Path(sys.base_prefix),
            Path(sys.prefix),
            REPO_ROOT,
            self.venv_bin,
            *([exec_dir] if exec_dir is not None else []),
            *self.shares,
        ]
        found: list[str] = []
        for path in paths:
            real = os.path.realpath(path)
            if os.path.exists(real) and real not in found:
                found.append(real)
        return found

    def plan(
        self,
        volumes: list[tuple[str, str, bool]],
        exec_dir: Path | None,
    ) -> list[MountOp]:
        """`volumes`: (source, target, read-only) binds of the container's own directories.
        The `--share` directories stand in for a git server: read-only, and idmapped so that
        the container's user owns what root owns there (git checks owners; a server would
        serve the repository whatever its modes on disk)."""
        binds = [(path, path, True) for path in self.runtime_shares(exec_dir)]
        binds += volumes
        owned = tuple(os.path.realpath(share) for share in self.shares)
        return mount_plan(self.hidden(), binds, owned=owned)

    def sandbox_spec(
        self,
        *,
        security: ContainerSecurity,
        plan: list[MountOp] | None,
        executable: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
    ) -> dict[str, Any]:
        identity = None
        if security.uid is not None:
            gid = security.gid if security.gid is not None else 0
            identity = {"uid": security.uid, "gid": gid, "groups": list(security.groups)}
        return {
            "mounts": None
            if plan is None
            else [
                {
                    "kind": op.kind,
                    "target": op.target,
                    "source": op.source,
                    "readOnly": op.read_only,
                    "mode": op.mode,
                    "owned": op.owned,
                }
                for op in plan
            ],
            "identity": identity,
            "capabilities": sorted(CAPABILITIES.index(c) for c in security.capabilities),
            "noNewPrivs": security.no_new_privs,
            "executable": executable,
            "argv": argv,
            "env": env,
            "cwd": cwd,
        }

    def write_spec(self, path: Path, spec: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)

    def launcher(self, spec_file: Path) -> list[str]:
        return [sys.executable, "-I", "-S", str(SANDBOX), str(spec_file)]
