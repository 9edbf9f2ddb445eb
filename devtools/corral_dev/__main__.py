"""`python -m corral_dev up|down|status`: the local control plane and node for kubectl users."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import controlplane

DEV_DIR = Path(os.environ.get("CORRAL_DEV_DIR", controlplane.REPO_ROOT / ".corral" / "dev"))
PIDS = DEV_DIR / "pids.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def up() -> int:
    if PIDS.exists() and all(_alive(p) for p in json.loads(PIDS.read_text()).values()):
        print(f"dev cluster already running; kubeconfig: {DEV_DIR / 'kubeconfig'}")
        return 0
    shutil.rmtree(DEV_DIR, ignore_errors=True)
    plane = controlplane.start(DEV_DIR / "state")
    controlplane.install_crds(plane)
    shutil.copy(plane.kubeconfig, DEV_DIR / "kubeconfig")
    pids = {name: proc.pid for name, proc in plane.processes.items()}
    node_log = (DEV_DIR / "state" / "logs" / "local-node.log").open("wb")
    node = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "corral_dev.localnode",
            "--kubeconfig",
            str(plane.kubeconfig),
            "--workdir",
            str(DEV_DIR / "node"),
        ],
        stdout=node_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pids["local-node"] = node.pid
    PIDS.write_text(json.dumps(pids))
    print(f"dev cluster up ({plane.server}); local node pid {node.pid}")
    print(f"export KUBECONFIG={DEV_DIR / 'kubeconfig'}")
    print(f"export PATH={plane.bin_dir}:$PATH   # kubectl and helm")
    return 0


def down() -> int:
    if not PIDS.exists():
        print("no dev cluster")
        return 0
    pids = json.loads(PIDS.read_text())
    for pid in pids.values():
        if _alive(pid):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p) for p in pids.values()):
        time.sleep(0.2)
    for pid in pids.values():
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    PIDS.unlink()
    print("dev cluster stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corral_dev", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "build"])
    args = parser.parse_args(argv)
    if args.command == "build":
        print(controlplane.binaries())
        return 0
    return up() if args.command == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
