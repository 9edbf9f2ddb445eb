"""A real node for the local control plane: containerd + runc + CNI + kubelet, kube-proxy,
kube-scheduler, CoreDNS and an iptables NetworkPolicy enforcer (kube-router's firewall).

`build()` runs hack/node/ (Debian packages, the pinned binaries, the pause and CoreDNS images,
Corral's images from a debootstrap base; all cached under ~/.cache/corral). `start(plane, work)`
brings the node up against a running `ControlPlane`:

- a network namespace of its own (`_realnode_net`): containerd, the kubelet, kube-proxy and
  kube-router run in it, so their iptables rules never touch this host's; one veth pair joins
  it to this host in 198.18.(128+slot).0/30 and pods get 198.18.<slot>.0/24 from the CNI bridge;
- a relay (`_realnode_relay`) gives the namespace the API server's 127.0.0.1:<port>, and
  listens on the node's address too: when the API server publishes no endpoint for the
  `kubernetes` Service (it advertises 127.0.0.1, which Endpoints refuse), the node publishes
  that address, so a pod reaches the API server through the Service as in any cluster;
- containerd with its own root, state and sockets under `work`, images imported into `k8s.io`;
- the kubelet registered as `system:node:<name>`; the node is named by its IP, so the API
  server (which prefers a node's Hostname address) reaches it for logs and exec without DNS;
- kube-scheduler on this host (the local control plane has none), kube-proxy in iptables mode,
  kube-router with only `--run-firewall`, and CoreDNS as a pod behind `kube-dns`.

`RealNode.stop()` stops all of it, removes every container, unmounts everything under `work`,
deletes the namespace (and with it every rule the node made) and the host's end of the link.
A run killed before it could stop is reaped by the next `start()`: each node claims a slot
under /run/corral-realnode recording its pid and work dir. Needs root; `unavailable_reason()`
says why a machine cannot run it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import _realnode_config as cfg
from . import _realnode_net as rnet
from .controlplane import REPO_ROOT, SERVICE_CIDR, ControlPlane

HACK = REPO_ROOT / "hack" / "node"
# Services for a control plane the node serves must be in 198.18.0.0/15 (cfg.Addresses checks).
NODE_SERVICE_CIDR = "198.19.0.0/16"


class NodeError(Exception):
    """The real node could not be built or started."""


@dataclass(frozen=True)
class Artifacts:
    """What hack/node/ built: binaries and OCI archives, by the keys the scripts print."""

    values: dict[str, str]

    def __getitem__(self, key: str) -> str:
        return self.values[key]

    @property
    def k8s_bin(self) -> Path:
        return Path(self.values["K8S_BIN"])

    def archives(self) -> dict[str, Path]:
        """Image reference -> its OCI archive, for every image that was built."""
        out: dict[str, Path] = {}
        for name in ("PAUSE", "COREDNS", "BASE", "OPERATOR", "SANDBOX"):
            if f"{name}_IMAGE" in self.values:
                out[self.values[f"{name}_IMAGE"]] = Path(self.values[f"{name}_OCI"])
        return out


def _script(
    name: str, timeout: float, *, hack: Path = HACK, env: dict[str, str] | None = None
) -> dict[str, str]:
    """Run hack/node/`name` (of another checkout with `hack`); its `KEY=VALUE` lines."""
    start = time.monotonic()
    done = subprocess.run(
        ["bash", str(hack / name)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )
    where = "hack/node" if hack == HACK else str(hack)
    if done.returncode != 0:
        raise NodeError(f"{where}/{name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    sys.stderr.write(done.stderr)
    sys.stderr.write(f"{where}/{name}: {time.monotonic() - start:.1f}s\n")
    values: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isupper():
            values[key] = value
    return values


def build(*, images: bool = True, timeout: float = 3600) -> Artifacts:
    """Install the packages, build the node's binaries and (with `images`) Corral's images."""
    _script("install-packages.sh", timeout)
    values = _script("build-node.sh", timeout)
    if images:
        values.update(_script("build-images.sh", timeout))
    return Artifacts(values)


def unavailable_reason() -> str | None:
    """Why this machine cannot run the real node (None: it can, as far as can be told)."""
    if sys.platform != "linux":
        return f"the real node needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the real node needs root (network namespaces, mounts, containerd)"
    for tool in ("ip", "nsenter", "mount", "umount", "sysctl", "apt-get", "go"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    if not Path("/proc/sys/net/bridge").exists():
        return "this kernel has no br_netfilter (/proc/sys/net/bridge)"
    if not Path("/sys/fs/cgroup").is_dir():
        return "no cgroup filesystem at /sys/fs/cgroup"
    return None


# --------------------------------------------------------------------------------- the node


@dataclass
class RealNode:
    plane: ControlPlane
    net: rnet.NodeNet
    work: Path
    artifacts: Artifacts
    name: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _stopped: bool = False

    @property
    def addrs(self) -> cfg.Addresses:
        return self.net.addrs

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    @property
    def socket(self) -> Path:
        return self.work / "containerd" / "containerd.sock"

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`ctr` against the node's containerd, namespace k8s.io (the kubelet's)."""
        return rnet.run(
            "ctr", "--address", str(self.socket), "-n", "k8s.io", *args, timeout=timeout
        )

    def in_netns(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a command in the node's network namespace (as the node sees the network)."""
        return rnet.run(*self.net.nsenter(), *argv, check=False, timeout=timeout)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    # ------------------------------------------------------------------ processes

    def _spawn(self, name: str, argv: Sequence[str], *, netns: bool) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": f"{self.artifacts.k8s_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
            "/usr/bin:/sbin:/bin",
            "HOME": str(self.work),
            "LANG": "C.UTF-8",
        }
        full = [*self.net.nsenter(), *argv] if netns else list(argv)
        with (self.logs / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                full,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.work,
                start_new_session=True,
            )
        self.processes[name] = proc
        return proc

    def _check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise NodeError(f"{name} exited ({proc.returncode}):\n{self.log_tail(name)}")

    def _wait(self, what: str, test: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not test():
            self._check_alive()
            if time.monotonic() > deadline:
                raise NodeError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.25)

    # ------------------------------------------------------------------ teardown

    def stop(self, *, keep_logs: bool = True) -> list[str]:
        """Stop everything the node started and clean the host; returns what could not be
        cleaned (empty when all went). Safe to call twice."""
        if self._stopped:
            return []
        self._stopped = True
        problems: list[str] = []
        for name in ("kube-router", "kube-proxy", "kube-scheduler", "kubelet"):
            _terminate(self.processes.pop(name, None), grace=10)
        containerd = self.processes.get("containerd")
        if containerd is not None and containerd.poll() is None:
            problems += self._remove_containers()
        _terminate(self.processes.pop("containerd", None), grace=10)
        for name in list(self.processes):
            _terminate(self.processes.pop(name), grace=5)
        # Whatever is left (shims, containers) is in the node's namespaces or names its work
        # dir; then the mounts, the namespace and the link go.
        left = rnet.reap(self.net, self.work)
        problems += left
        rnet.release_slot(self.net)
        if not left:
            for sub in ("containerd", "kubelet", "pod-logs", "cni"):
                shutil.rmtree(self.work / sub, ignore_errors=True)
            if not keep_logs:
                shutil.rmtree(self.work, ignore_errors=True)
        return problems

    def _remove_containers(self) -> list[str]:
        """Kill and delete every container task while containerd still answers (best effort:
        `rnet.reap` then kills whatever is left in the node's namespaces)."""
        try:
            listed = self.ctr("tasks", "ls", "-q", timeout=20).stdout.split()
        except (rnet.NetError, subprocess.TimeoutExpired) as e:
            return [f"could not list containers: {e}"]
        for task in listed:
            with contextlib.suppress(rnet.NetError, subprocess.TimeoutExpired):
                self.ctr("tasks", "delete", "--force", task, timeout=20)
        return []


def _terminate(proc: subprocess.Popen[bytes] | None, grace: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# ---------------------------------------------------------------------------------- start


def _api_port(plane: ControlPlane) -> int:
    parsed = urllib.parse.urlsplit(plane.server)
    if parsed.hostname != "127.0.0.1" or parsed.port is None:
        raise NodeError(f"expected the API server on 127.0.0.1:<port>, not {plane.server}")
    return parsed.port


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def start(
    plane: ControlPlane,
    work: Path,
    *,
    artifacts: Artifacts | None = None,
    service_cidr: str = SERVICE_CIDR,
    images: Iterable[str] | None = None,
    timeout: float = 180,
) -> RealNode:
    """Bring the node up against `plane` (whose Services are in `service_cidr`). `images`
    limits which built images are imported (default: all). On failure, everything started so
    far is stopped and cleaned before the error propagates."""
    reason = unavailable_reason()
    if reason:
        raise NodeError(reason)
    artifacts = artifacts or build()
    work.mkdir(parents=True, exist_ok=True)
    try:
        net = rnet.claim_slot(service_cidr, work.resolve())
    except (ValueError, rnet.NetError, OSError) as e:
        raise NodeError(str(e)) from e
    name = net.addrs.node_ip
    node = RealNode(plane, net, work.resolve(), artifacts, name)
    t0 = time.monotonic()
    try:
        net.setup()
        _start(node, images, timeout)
    except BaseException as e:
        problems = node.stop()
        if problems:
            sys.stderr.write("real node cleanup left: " + "; ".join(problems) + "\n")
        if isinstance(e, rnet.NetError | subprocess.SubprocessError | OSError):
            detail = getattr(e, "stderr", None) or ""
            raise NodeError(f"{e}\n{detail}".rstrip()) from e
        raise
    took = time.monotonic() - t0
    sys.stderr.write(f"real node {name} up in {took:.1f}s (slot {net.addrs.slot})\n")
    return node


def _start(node: RealNode, images: Iterable[str] | None, timeout: float) -> None:
    """Start the node's components in order, each step waiting for what the next needs."""
    api_port = _api_port(node.plane)
    _start_relay(node, api_port)
    _start_containerd(node, images)
    kubeconfigs = _node_identities(node)
    _start_kubelet(node, kubeconfigs.kubelet)
    _start_scheduler(node, kubeconfigs.scheduler)
    _wait_registered(node, timeout)
    _start_proxy_and_firewall(node, kubeconfigs.proxy, kubeconfigs.router)
    _wait_node_ready(node, timeout)
    _publish_api_endpoint(node)
    _start_coredns(node, timeout)


# Where pods reach the API server (the `kubernetes` Service's endpoint) on the node's address:
# a fixed port outside the node-port range (30000-32767), since kube-router lets traffic to a
# node-local port in that range past every NetworkPolicy (it takes it for a NodePort), and a
# free port of this host often falls there. Each node has its own namespace: no two collide.
POD_API_PORT = 6443


def _start_relay(node: RealNode, api_port: int) -> None:
    """The API server inside the namespace: on its 127.0.0.1 for the node's components, on the
    node's address for pods (the `kubernetes` Service's endpoint, see _publish_api_endpoint)."""
    node._spawn(
        "relay",
        [
            sys.executable,
            "-m",
            "corral_dev._realnode_relay",
            "--netns",
            str(node.net.netns_path),
            "--target",
            f"127.0.0.1:{api_port}",
            "--listen",
            f"127.0.0.1:{api_port}",
            "--listen",
            f"{node.addrs.node_ip}:{POD_API_PORT}",
        ],
        netns=False,
    )


def _start_containerd(node: RealNode, images: Iterable[str] | None) -> None:
    """containerd, then the images (`images` limits the built ones; pause and CoreDNS always)."""
    work, addrs = node.work, node.addrs
    conf = _write(
        work / "containerd" / "config.toml",
        cfg.containerd_toml(work, node.artifacts["PAUSE_IMAGE"]),
    )
    _write(work / "cni" / "net.d" / "10-corral.conflist", cfg.cni_conflist(work, addrs))
    node._spawn("containerd", ["containerd", "--config", str(conf)], netns=True)
    node._wait("containerd's socket", node.socket.exists, 30)
    t = time.monotonic()
    wanted = set(images) if images is not None else None
    for ref, archive in node.artifacts.archives().items():
        if (
            wanted is None
            or ref in wanted
            or ref in (node.artifacts["PAUSE_IMAGE"], node.artifacts["COREDNS_IMAGE"])
        ):
            node.ctr("images", "import", "--no-unpack=false", str(archive), timeout=300)
    sys.stderr.write(f"real node: images imported in {time.monotonic() - t:.1f}s\n")


@dataclass(frozen=True)
class _NodeKubeconfigs:
    """The kubeconfig of each node component that talks to the API server."""

    kubelet: Path
    proxy: Path
    router: Path
    scheduler: Path


def _node_identities(node: RealNode) -> _NodeKubeconfigs:
    """The node's RBAC, then a kubeconfig for each of its components."""
    plane = node.plane
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(cfg.rbac(node.name)))
    kubelet = plane.user_kubeconfig(f"system:node:{node.name}", ["system:nodes"])
    proxy = plane.user_kubeconfig("system:kube-proxy")
    router = plane.user_kubeconfig(cfg.KUBE_ROUTER_USER)
    scheduler = plane.user_kubeconfig("system:kube-scheduler")
    return _NodeKubeconfigs(kubelet=kubelet, proxy=proxy, router=router, scheduler=scheduler)


def _start_kubelet(node: RealNode, kubeconfig: Path) -> None:
    work, addrs = node.work, node.addrs
    kubelet_conf = _write(
        work / "kubelet-config.json", json.dumps(cfg.kubelet_config(work, addrs), indent=2)
    )
    (work / "pod-logs").mkdir(exist_ok=True)
    node._spawn(
        "kubelet",
        [
            str(node.artifacts.k8s_bin / "kubelet"),
            f"--config={kubelet_conf}",
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={node.name}",
            f"--node-ip={addrs.node_ip}",
            f"--root-dir={work / 'kubelet'}",
            "--v=1",
        ],
        netns=True,
    )


def _start_scheduler(node: RealNode, kubeconfig: Path) -> None:
    """The scheduler, on this host (the local control plane runs none)."""
    node._spawn(
        "kube-scheduler",
        [
            str(node.artifacts.k8s_bin / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
            f"--cert-dir={node.work / 'scheduler'}",
            "--v=1",
        ],
        netns=False,
    )


def _wait_registered(node: RealNode, timeout: float) -> None:
    """Wait for the kubelet to register the node, then give it its pod CIDR."""
    plane, addrs = node.plane, node.addrs

    def registered() -> bool:
        return plane.kubectl("get", "node", node.name, check=False).returncode == 0

    node._wait(f"node {node.name} to register", registered, timeout)
    plane.kubectl(
        "patch",
        "node",
        node.name,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"podCIDR": addrs.pod_cidr, "podCIDRs": [addrs.pod_cidr]}}),
        check=False,
    )


def _start_proxy_and_firewall(node: RealNode, proxy_kc: Path, router_kc: Path) -> None:
    """kube-proxy and the NetworkPolicy firewall (kube-router)."""
    proxy_conf = _write(
        node.work / "kube-proxy.json",
        json.dumps(cfg.kube_proxy_config(proxy_kc, node.name, node.addrs), indent=2),
    )
    bins = node.artifacts.k8s_bin
    node._spawn("kube-proxy", [str(bins / "kube-proxy"), f"--config={proxy_conf}"], netns=True)
    node._spawn(
        "kube-router",
        [node.artifacts["KUBE_ROUTER"], *cfg.kube_router_args(router_kc, node.name, node.addrs)],
        netns=True,
    )


def _wait_node_ready(node: RealNode, timeout: float) -> None:
    """Wait for the node's Ready condition, then lift its not-ready taint."""
    plane = node.plane

    def ready() -> bool:
        done = plane.kubectl(
            "get",
            "node",
            node.name,
            "-o",
            'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
            check=False,
        )
        return done.stdout.strip() == "True"

    node._wait(f"node {node.name} Ready", ready, timeout)
    # The kubelet registers with the not-ready taint; the node lifecycle controller that would
    # lift it is not run by the local control plane (its KCM runs without it).
    plane.kubectl(
        "taint", "node", node.name, "node.kubernetes.io/not-ready:NoSchedule-", check=False
    )


def _start_coredns(node: RealNode, timeout: float) -> None:
    """CoreDNS as a pod, reaching the API server through the `kubernetes` Service."""
    plane = node.plane
    pki = plane.state_dir / "pki"
    dns_kc = plane.user_kubeconfig(cfg.COREDNS_USER)
    dns_conf = yaml.safe_load(dns_kc.read_text())
    user = dns_conf["users"][0]["user"]
    kubeconfig = cfg.pod_kubeconfig(
        (pki / "ca.crt").read_text(),
        Path(user["client-certificate"]).read_text(),
        Path(user["client-key"]).read_text(),
        cfg.COREDNS_USER,
        node.addrs.api_service_ip,
    )
    objects = cfg.coredns_objects(node.artifacts["COREDNS_IMAGE"], kubeconfig, node.addrs)
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))

    def dns_ready() -> bool:
        done = plane.kubectl(
            "get",
            "deployment",
            "coredns",
            "-n",
            cfg.DNS_NAMESPACE,
            "-o",
            "jsonpath={.status.readyReplicas}",
            check=False,
        )
        return done.stdout.strip() == "1"

    node._wait("CoreDNS ready", dns_ready, timeout)


def _publish_api_endpoint(node: RealNode) -> None:
    """Give the `kubernetes` Service an endpoint pods can reach, if the API server has none.

    The local API server advertises 127.0.0.1, which it may not publish (an Endpoints address
    may not be loopback: it logs "unable to sync kubernetes service" and the Service has no
    endpoint). The node then publishes its own EndpointSlice for the Service: the node's address
    and POD_API_PORT, where the relay listens in the node's namespace."""
    plane = node.plane
    selector = "kubernetes.io/service-name=kubernetes"
    found = plane.kubectl(
        "get",
        "endpointslices",
        "-n",
        "default",
        "-l",
        selector,
        "-o",
        "jsonpath={.items[*].metadata.name}",
        check=False,
    ).stdout.split()
    if any(name != cfg.API_SLICE_NAME for name in found):
        return  # the API server publishes its own address
    slice_ = cfg.api_endpoint_slice(node.addrs.node_ip, POD_API_PORT)
    plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(slice_))


# ------------------------------------------------------------------- a node of its own process


def plane_from_state(state_dir: Path, server: str, bin_dir: Path) -> ControlPlane:
    """The `ControlPlane` another process started in `state_dir` (its processes not included:
    this one can mint identities and run kubectl, not stop it)."""
    pki = state_dir / "pki"
    return ControlPlane(
        state_dir=state_dir,
        bin_dir=bin_dir,
        server=server,
        ca_file=pki / "ca.crt",
        kubeconfig=state_dir / "kubeconfig",
        sa_key=pki / "sa.key",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m corral_dev.realnode`: run the node until SIGTERM or SIGINT, then stop it.

    The development cluster runs the node this way (a process of its own, as the local node),
    so `python -m corral_dev down` stops it with one signal and the node's slot is held by a
    live process for as long as the node runs. When the node is up, `--ready` gets a JSON
    object: its name, slot and addresses."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m corral_dev.realnode", description=__doc__)
    parser.add_argument("--plane-state", type=Path, required=True, help="control plane dir")
    parser.add_argument("--server", required=True, help="the API server, https://127.0.0.1:N")
    parser.add_argument("--bin-dir", type=Path, required=True, help="kubectl and friends")
    parser.add_argument("--work", type=Path, required=True, help="the node's work dir")
    parser.add_argument("--artifacts", type=Path, help="JSON of what hack/node/ built")
    parser.add_argument("--ready", type=Path, required=True, help="written once the node is up")
    args = parser.parse_args(argv)

    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    plane = plane_from_state(args.plane_state, args.server, args.bin_dir)
    artifacts = Artifacts(json.loads(args.artifacts.read_text())) if args.artifacts else None
    try:
        node = start(plane, args.work, artifacts=artifacts, service_cidr=NODE_SERVICE_CIDR)
    except NodeError as e:
        sys.stderr.write(f"the real node did not start: {e}\n")
        return 1
    info = {
        "name": node.name,
        "slot": node.addrs.slot,
        "node_ip": node.addrs.node_ip,
        "host_ip": node.addrs.host_ip,
        "pod_cidr": node.addrs.pod_cidr,
        "work": str(node.work),
    }
    args.ready.write_text(json.dumps(info))
    sys.stderr.write(f"real node {node.name} running; SIGTERM stops it\n")
    try:
        while not stop:
            time.sleep(0.5)
            try:
                node._check_alive()
            except NodeError as e:
                sys.stderr.write(f"{e}\n")
                break
    finally:
        problems = node.stop()
        for problem in problems:
            sys.stderr.write(f"real node cleanup left: {problem}\n")
    sys.stderr.write("real node stopped\n")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
