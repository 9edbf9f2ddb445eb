"""The real node's network namespace and what is left to clean on this host.

The node's containerd, kubelet, kube-proxy and kube-router run inside a network namespace of
their own (`ip netns` name `corral-node-<slot>`), joined to this host by one veth pair in
198.18.(128+slot).0/30, with a route to the node's pod range through it. Every iptables rule
and ipset the node's components make lives in that namespace and goes with it; on this host
the node adds only the veth (deleted with the namespace) and its route (deleted with the veth).
The namespace has no default route: a pod reaches the node, its own pods and this host's end of
the link, nothing else.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ._realnode_config import MAX_SLOTS, Addresses

SLOTS_DIR = Path("/run/corral-realnode")
NETNS_DIR = Path("/run/netns")


class NetError(Exception):
    """The node's network could not be set up."""


def run(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise NetError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class NodeNet:
    addrs: Addresses

    @property
    def netns(self) -> str:
        return f"corral-node-{self.addrs.slot}"

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns

    @property
    def host_if(self) -> str:
        return f"crln{self.addrs.slot}h"

    @property
    def node_if(self) -> str:
        return "eth0"

    def nsenter(self) -> list[str]:
        """The prefix that runs a command in the node's network namespace only (not its own
        mount namespace, unlike `ip netns exec`: the kubelet's mounts must be containerd's)."""
        return ["nsenter", f"--net={self.netns_path}", "--"]

    def setup(self) -> None:
        a = self.addrs
        ns = self.netns
        run("ip", "netns", "add", ns)
        try:
            run(
                "ip",
                "link",
                "add",
                self.host_if,
                "type",
                "veth",
                "peer",
                "name",
                self.node_if,
                "netns",
                ns,
            )
            run("ip", "addr", "add", f"{a.host_ip}/{a.link_prefix}", "dev", self.host_if)
            run("ip", "link", "set", self.host_if, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            run("ip", "-n", ns, "addr", "add", f"{a.node_ip}/{a.link_prefix}", "dev", self.node_if)
            run("ip", "-n", ns, "link", "set", self.node_if, "up")
            run("ip", "route", "add", a.pod_cidr, "via", a.node_ip, "dev", self.host_if)
            for key, value in (
                ("net.ipv4.ip_forward", "1"),
                # Bridged pod-to-pod traffic passes iptables: NetworkPolicy and Service NAT.
                ("net.bridge.bridge-nf-call-iptables", "1"),
            ):
                run(*self.nsenter(), "sysctl", "-q", "-w", f"{key}={value}")
        except BaseException:
            self.teardown()
            raise

    def teardown(self) -> None:
        """Delete the namespace (its veth end, bridge, iptables rules and ipsets with it) and
        this host's end of the link (its route with it). Idempotent."""
        if self.netns_path.exists():
            run("ip", "-n", self.netns, "link", "del", self.node_if, check=False)
            run("ip", "netns", "del", self.netns, check=False)
        if Path(f"/sys/class/net/{self.host_if}").exists():
            run("ip", "link", "del", self.host_if, check=False)


def claim_slot(service_cidr: str, work: Path) -> NodeNet:
    """A free slot on this machine. Its directory under /run holds the claiming pid and the
    node's work dir; a slot whose claimant is gone is reaped (whatever its node left running,
    mounted or configured is removed) and taken."""
    SLOTS_DIR.mkdir(parents=True, exist_ok=True)
    for slot in range(MAX_SLOTS):
        path = SLOTS_DIR / str(slot)
        net = NodeNet(Addresses(slot, service_cidr))
        try:
            path.mkdir()
        except FileExistsError:
            try:
                owner = int((path / "pid").read_text())
            except (OSError, ValueError):
                owner = 0
            if owner == 0 and time.time() - path.stat().st_mtime < 10:
                continue  # being claimed right now
            if owner and _alive(owner):
                continue
            reap(net, _recorded_work(path))
            shutil.rmtree(path, ignore_errors=True)
            try:
                path.mkdir()
            except FileExistsError:
                continue
        (path / "pid").write_text(str(os.getpid()))
        (path / "work").write_text(str(work))
        if net.netns_path.exists() or Path(f"/sys/class/net/{net.host_if}").exists():
            shutil.rmtree(path, ignore_errors=True)  # someone else's namespace: leave it be
            continue
        return net
    raise NetError(f"no free node slot on this machine (all {MAX_SLOTS} in {SLOTS_DIR} taken)")


def _recorded_work(path: Path) -> Path | None:
    try:
        text = (path / "work").read_text().strip()
    except OSError:
        return None
    return Path(text) if text.startswith("/") and text != "/" else None


def reap(net: NodeNet, work: Path | None) -> list[str]:
    """Kill every process of the node (in its network namespace or its pods', or naming its
    work dir or namespace on the command line), unmount everything under its work dir, delete
    the namespace and this host's end of the link, and drop its container log links. Returns
    what is left (empty when all went)."""
    namespaces = set()
    with contextlib.suppress(OSError):
        namespaces.add(os.stat(net.netns_path).st_ino)
    if work is not None:
        for point in mounts_under(work):
            if "/netns/" in point:
                with contextlib.suppress(OSError):
                    namespaces.add(os.stat(point).st_ino)
    # The node's own files on its processes' command lines: containerd's config and socket
    # (its shims), the kubelet's root dir, the scheduler's cert dir, kube-proxy's config.
    markers = [str(net.netns_path)]
    if work is not None:
        markers += [
            f"{work}/{name}" for name in ("containerd/", "kubelet", "scheduler", "kube-proxy.json")
        ]
    for _ in range(3):
        victims = pids_in(namespaces, markers)
        if not victims:
            break
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        time.sleep(0.5)
    left = []
    if work is not None:
        left += [f"still mounted: {p}" for p in unmount_all(work)]
        remove_container_log_links(work)
    net.teardown()
    if net.netns_path.exists():
        left.append(f"network namespace {net.netns} is still there")
    return left


def release_slot(net: NodeNet) -> None:
    shutil.rmtree(SLOTS_DIR / str(net.addrs.slot), ignore_errors=True)


# ------------------------------------------------------------------------- host leftovers


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`, deepest first."""
    found: list[str] = []
    prefix = str(root.resolve())
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount_all(root: Path) -> list[str]:
    """Unmount everything at or below `root` (the kubelet's rshared root dir, its volumes,
    containerd's rootfs and pod network namespace mounts). Returns what stayed mounted."""
    for _ in range(3):
        points = mounts_under(root)
        if not points:
            return []
        for point in points:
            if run("umount", point, check=False).returncode != 0:
                run("umount", "-l", point, check=False)
    return mounts_under(root)


def pids_in(namespaces: set[int], markers: list[str]) -> list[int]:
    """Processes in one of the network namespaces (by nsfs inode) or whose command line
    contains one of `markers`: what a node started, and nothing else."""
    found: list[int] = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            link = os.readlink(entry / "ns" / "net")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        inode = link.partition("[")[2].rstrip("]")
        if (inode.isdigit() and int(inode) in namespaces) or any(m in cmdline for m in markers):
            found.append(int(entry.name))
    return found


def remove_container_log_links(work: Path) -> None:
    """The kubelet links each container's log into /var/log/containers (a fixed path): remove
    the links that point into this node's work directory."""
    logs = Path("/var/log/containers")
    prefix = str(work.resolve())
    if not logs.is_dir():
        return
    for link in logs.iterdir():
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link).startswith(prefix):
                link.unlink()
