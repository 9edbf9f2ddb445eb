"""The local node: a kubelet and container runtime replaced by local processes
(docs/architecture.md, "The local node").

It registers a Node, binds every Pending pod that has no node to itself (pods/binding), runs
the pod's init containers and then its containers as processes on this machine (the image is
ignored; the container's command and args run with the project's venv on PATH), gives each pod
its own loopback address 127.0.X.Y, writes pod status (phase, IPs, conditions, container
states, readiness) through pods/status, and kills the processes when the pod is deleted. Nothing
else is replaced: the API server, admission, RBAC and the operator are the real ones.

Run as root, each container process runs as its securityContext's uid, gid and groups (fsGroup
included), in its own mount namespace where only its own volumes are visible: the node's
workdir, /root, /tmp and the cluster's state directory are hidden, and the Python installation,
the venv, the sources and any `--share` directory (read-only) are bound back. Not as root, it
says so and refuses pods that ask for a user it cannot switch to.

    python -m corral_dev.localnode --kubeconfig K --workdir D [--node-name N] [--share DIR]...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from corral_api.timestamps import now_rfc3339
from corral_kube import Conflict, Gone, KubeClient, KubeError, NotFound

from ._node_host import NodeHost, shares_from_env
from ._node_kube import node_kube
from ._node_pod import PodRunner

log = logging.getLogger("corral.localnode")
HOST_IP = "127.0.0.1"
DEFAULT_NODE_NAME = "corral-local-node"


class LoopbackPool:
    """Hands out 127.0.X.Y addresses (Linux routes all of 127/8 to lo), one per pod.

    The first octet pair is picked at random, so two local nodes on one machine (two test runs)
    are unlikely to hand out the same address at once.
    """

    def __init__(self, seed: int | None = None) -> None:
        rng = random.Random(seed)
        self._next = rng.randrange(2, 250) * 256 + 1
        self._used: set[str] = set()

    def take(self, preferred: str | None = None) -> str:
        """A free address; `preferred` when it is free (a pod keeps its IP across node restarts)."""
        usable = preferred and preferred.startswith("127.0.") and preferred != HOST_IP
        if preferred and usable and preferred not in self._used:
            self._used.add(preferred)
            return preferred
        for _ in range(254 * 254):
            x, y = divmod(self._next, 256)
            self._next = self._next + 1 if self._next < 254 * 256 + 254 else 2 * 256 + 1
            if not 1 <= y <= 254 or not 1 <= x <= 254:
                continue
            address = f"127.0.{x}.{y}"
            if address not in self._used:
                self._used.add(address)
                return address
        raise RuntimeError("no loopback address left")

    def give_back(self, address: str) -> None:
        self._used.discard(address)


class LocalNode:
    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        node_name: str = DEFAULT_NODE_NAME,
        venv_bin: Path | None = None,
        shares: list[Path] | None = None,
        root: bool | None = None,
    ) -> None:
        """`shares`: host directories every container sees read-only (by default those in
        $CORRAL_NODE_SHARE). `root`: whether to switch users and isolate mounts (by default,
        whether the node runs as root; False runs every process as the node's user)."""
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.node_name = node_name
        self.venv_bin = venv_bin or Path(sys.executable).parent
        self.host = NodeHost(
            workdir=workdir,
            venv_bin=self.venv_bin,
            kubeconfig=kubeconfig,
            shares=shares_from_env() if shares is None else list(shares),
        )
        if root is not None:
            self.host.root = root and os.geteuid() == 0
        self.pool = LoopbackPool()
        self.pods: dict[str, PodRunner] = {}  # by uid
        self._stop = asyncio.Event()
        self._kube: KubeClient | None = None
        self._finishing: set[asyncio.Task[None]] = set()
        self._deleting: set[str] = set()  # uids whose removal is under way

    # --------------------------------------------------------------------------------- running

    async def run(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.host.root:
            # Only root reads the pods' directories.
            (self.workdir / "pods").mkdir(mode=0o700, exist_ok=True)
        else:
            log.warning(
                "the local node runs as uid %d, not as root with user switching on: every "
                "container runs as this user with no mount isolation, and a pod asking for "
                "another runAsUser is refused",
                os.geteuid(),
            )
        self.host.start()
        self._kube = node_kube(self.kubeconfig)
        try:
            await self._register()
            watcher = asyncio.create_task(self._watch_pods(), name="watch pods")
            heartbeat = asyncio.create_task(self._heartbeat(), name="heartbeat")
            await self._stop.wait()
            for task in (watcher, heartbeat):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await asyncio.gather(*(runner.stop(grace=2.0) for runner in self.pods.values()))
            self.pods.clear()
        finally:
            await self._kube.aclose()

    async def stop(self) -> None:
        self._stop.set()

    @property
    def kube(self) -> KubeClient:
        assert self._kube is not None, "the node is not running"
        return self._kube

    def _node_status(self) -> dict[str, Any]:
        capacity = {"cpu": "8", "memory": "32Gi", "pods": "250", "ephemeral-storage": "100Gi"}
        stamp = now_rfc3339()
        return {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": self.node_name},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "LocalNodeReady",
                    "message": "the corral local node runs pods as local processes"
                    + (
                        ", each container as its own uid in its own mount namespace"
                        if self.host.root
                        else "; not root: no user switching, pods asking for a runAsUser "
                        "other than the node's are refused"
                    ),
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": stamp,
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v0.0.0-corral-local",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "local://processes",
                "osImage": "local",
                "kernelVersion": "",
                "machineID": self.node_name,
                "systemUUID": self.node_name,
                "bootID": self.node_name,
            },
        }

    @property
    def labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/hostname": self.node_name,
            "kubernetes.io/os": "linux",
            "corral.dev/local-node": "true",
        }

    def _fits(self, spec: dict[str, Any]) -> bool:
        """A pod's nodeSelector must match this node (the one scheduling rule honoured here)."""
        selector = spec.get("nodeSelector") or {}
        return all(self.labels.get(k) == v for k, v in selector.items())

    async def _register(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": self.labels},
        }
        with contextlib.suppress(Conflict):  # registered before: its status is patched below
            await self.kube.request("POST", "/api/v1/nodes", body=body)
        await self._patch_node_status()

    async def _patch_node_status(self) -> None:
        await self.kube.request(
            "PATCH",
            f"/api/v1/nodes/{self.node_name}/status",
            body={"status": self._node_status()},
            content_type="application/merge-patch+json",
        )

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(20)
            try:
                await self._patch_node_status()
            except KubeError as e:
                log.warning("node heartbeat failed: %s", e)

    # ---------------------------------------------------------------------------------- pods

    async def _watch_pods(self) -> None:
        while True:
            try:
                listed = await self.kube.request("GET", "/api/v1/pods")
                version = listed["metadata"]["resourceVersion"]
                seen = set()
                for pod in listed.get("items", []):
                    seen.add(pod["metadata"]["uid"])
                    await self._on_pod(pod)
                for uid in [u for u in self.pods if u not in seen]:
                    self._forget(uid, delete=False)
                while True:
                    async for event in self.kube.watch("/api/v1/pods", version):
                        pod = event.get("object") or {}
                        version = pod.get("metadata", {}).get("resourceVersion", version)
                        if event["type"] == "BOOKMARK":
                            continue
                        if event["type"] == "DELETED":
                            self._forget(pod["metadata"]["uid"], delete=False)
                        else:
                            await self._on_pod(pod)
            except Gone:
                continue  # list again from now
            except KubeError as e:
                log.warning("pod watch failed (%s); listing again", e)
                await asyncio.sleep(1.0)

    async def _on_pod(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid = meta["uid"]
        node = spec.get("nodeName")
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if not node:
            if phase == "Pending" and not meta.get("deletionTimestamp") and self._fits(spec):
                await self._bind(pod)
            return
        if node != self.node_name:
            return
        if meta.get("deletionTimestamp"):
            self._forget(uid, delete=True, pod=pod)
            return
        if uid not in self.pods and phase not in ("Succeeded", "Failed"):
            self._start(pod)

    async def _bind(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            await self.kube.request(
                "POST",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                body={
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": meta["name"], "uid": meta["uid"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
                },
            )
        except (NotFound, Conflict):
            pass  # gone, or bound by someone else meanwhile
        except KubeError as e:
            log.warning("binding %s/%s failed: %s", meta["namespace"], meta["name"], e)

    def _start(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        pod_dir = self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        runner = PodRunner(
            self.kube,
            pod,
            node_name=self.node_name,
            # An IP once reported may not change, so a pod restarted by a new node keeps it.
            pod_ip=self.pool.take((pod.get("status") or {}).get("podIP")),
            host_ip=HOST_IP,
            pod_dir=pod_dir,
            host=self.host,
        )
        self.pods[meta["uid"]] = runner
        log.info("pod %s/%s starts on %s", meta["namespace"], meta["name"], runner.pod_ip)
        runner.start()

    def _forget(self, uid: str, *, delete: bool, pod: dict[str, Any] | None = None) -> None:
        runner = self.pods.pop(uid, None)
        if (runner is None and not delete) or (delete and uid in self._deleting):
            return
        if delete:
            self._deleting.add(uid)
        task = asyncio.create_task(self._finish(runner, delete, pod))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _finish(
        self, runner: PodRunner | None, delete: bool, pod: dict[str, Any] | None
    ) -> None:
        grace = 30.0
        if pod is not None:
            grace = float(
                pod["metadata"].get("deletionGracePeriodSeconds")
                or pod["spec"].get("terminationGracePeriodSeconds", 30)
            )
        if runner is not None:
            await runner.stop(grace)
            self.pool.give_back(runner.pod_ip)
            # Volumes and homes go with the pod; its logs stay for whoever debugs it.
            for part in ("volumes", "home"):
                shutil.rmtree(runner.dir / part, ignore_errors=True)
        if delete and pod is not None:
            meta = pod["metadata"]
            # The kubelet's last word: the processes are gone, so the object may go now.
            try:
                await self.kube.request(
                    "DELETE",
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    body={
                        "apiVersion": "v1",
                        "kind": "DeleteOptions",
                        "gracePeriodSeconds": 0,
                        "preconditions": {"uid": meta["uid"]},
                    },
                )
            except (NotFound, Conflict):
                pass  # gone already, or another pod of that name now
            except KubeError as e:
                log.warning("removing %s/%s failed: %s", meta["namespace"], meta["name"], e)
            finally:
                self._deleting.discard(meta["uid"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m corral_dev.localnode", description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True, help="admin kubeconfig")
    parser.add_argument("--workdir", type=Path, required=True, help="pod dirs and logs")
    parser.add_argument("--node-name", default=DEFAULT_NODE_NAME)
    parser.add_argument("--venv-bin", type=Path, default=None, help="bin dir first on PATH")
    parser.add_argument(
        "--share",
        type=Path,
        action="append",
        default=None,
        help="a host directory every container sees read-only (repeatable; default: "
        "$CORRAL_NODE_SHARE, os.pathsep-separated), e.g. local git repositories to clone",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    shares = None if args.share is None else [*shares_from_env(), *args.share]
    node = LocalNode(args.kubeconfig, args.workdir, args.node_name, args.venv_bin, shares)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(node.stop()))
        await node.run()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
