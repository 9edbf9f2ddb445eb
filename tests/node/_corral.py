"""Corral installed on the node tier's cluster (this module holds no tests): the chart with
`helm install`, a git daemon and the scripted model on this host where pods reach it, a
server on this host that no sandbox may reach, and helpers to apply, wait, exec and probe.

Everything here goes through kubectl and helm against `Target`, so the same tests run on the
real node and on kind (hack/e2e-kind.sh).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socketserver
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from corral_dev import _realnode_stack as rstack

from .._scripted import load_script, model_requests, tool_results
from ._target import Target

T = TypeVar("T")

NAMESPACE = "corral-e2e"
RELEASE = "corral-node"
OPERATOR_NAMESPACE = rstack.OPERATOR_NAMESPACE
AGENT = "coder"
# A name the egress gateway resolves to this host (the chart's egressGateway.hosts); nothing
# else knows it, so only a request through the gateway can use it.
WELCOME_HOST = "welcome.corral.test"
UIDS = {"harness": 10001, "tools": 10002, "custodian": 10003}
FS_GROUP = 10000
OPERATOR_UID = 10001  # the chart's operator.runAsUser
# The archive's claim on the local node (a hostPath volume under the install's work directory);
# each install's own, named after its work directory, so none meets an earlier one's.
ARCHIVE_CLAIM = "corral-node-archive"

# Run in a pod with `python3 -c PROBE tcp HOST:PORT` or `python3 -c PROBE http URL [BODY]`:
# one line, `reached ...` or `blocked <error>` (exit 1).
PROBE = r"""
import os, random, socket, ssl, struct, sys, urllib.error, urllib.parse, urllib.request
kind, target = sys.argv[1], sys.argv[2]
try:
    if kind == "tcp":
        host, _, port = target.rpartition(":")
        socket.create_connection((host.strip("[]"), int(port)), timeout=3).close()
        print("reached")
    elif kind == "dns":
        # One query to the pod's resolver, UDP then TCP, 3 s each: an answer of any kind
        # (even NXDOMAIN) means DNS is reachable.
        server = next(l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver"))
        qname = b"".join(bytes([len(p)]) + p.encode() for p in target.split(".")) + b"\0"
        head = struct.pack(">HHHHHH", random.randrange(65536), 0x100, 1, 0, 0, 0)
        query = head + qname + b"\0\1\0\1"
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.settimeout(3)
        try:
            u.sendto(query, (server, 53))
            u.recvfrom(512)
            print("resolved udp")
            sys.exit(0)
        except OSError:
            pass
        t = socket.create_connection((server, 53), timeout=3)
        t.sendall(struct.pack(">H", len(query)) + query)
        if not t.recv(2):
            raise OSError("closed")
        print("resolved tcp")
    elif kind == "connect":
        # A CONNECT through the pod's HTTPS_PROXY, as a tool that honours it would send it.
        proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
        s = socket.create_connection((proxy.hostname, proxy.port), timeout=5)
        s.settimeout(5)
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode(errors="replace")
        parts = line.split(" ", 2)
        if len(parts) > 1 and parts[1] == "200":
            rest = head.split(b"\r\n\r\n", 1)[1] or s.recv(64)
            print(f"reached tunnel {rest.decode(errors='replace').strip()}")
        else:
            print(f"refused {' '.join(parts[1:])}")
            sys.exit(1)
    else:
        body = sys.argv[3].encode() if len(sys.argv) > 3 else None
        headers = {"content-type": "application/json", "x-api-key": "a-guess"}
        req = urllib.request.Request(target, data=body, headers=headers)
        ctx = ssl._create_unverified_context()
        try:
            with urllib.request.urlopen(req, timeout=3, context=ctx) as resp:
                print(f"reached HTTP{resp.status}")
        except urllib.error.HTTPError as e:
            print(f"reached HTTP{e.code}")
except Exception as e:
    print(f"blocked {type(e).__name__}")
    sys.exit(1)
"""


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float,
    detail: Callable[[], str] | None = None,
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            extra = f"\n{detail()}" if detail else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(0.5)


class _Refuser(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Hello(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with contextlib.suppress(OSError):
            self.request.sendall(b"hello\n")


@dataclass
class Corral:
    """Corral on `target`, watching NAMESPACE."""

    target: Target
    work: Path
    model_url: str
    git_url: str  # the test repository, git://HOST:PORT/work/repo
    forbidden: str  # HOST:PORT of a server on this host outside every sandbox's allowlist
    allowed: str  # HOST:PORT of the model: the custodian's through the gateway, not the agent's
    namespace: str = NAMESPACE
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # The port of a server on this host that an Agent may name as WELCOME_HOST (it says hello).
    welcome_port: int = 0

    @property
    def welcome(self) -> str:
        return f"{WELCOME_HOST}:{self.welcome_port}"

    # ----------------------------------------------------------------- cluster objects

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.target.kubectl(*args, **kw)

    def apply(self, *docs: dict[str, Any]) -> None:
        """`kubectl apply -f FILE`, as a person would."""
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("namespace", self.namespace)
        path = self.work / f"apply-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump_all(list(docs)))
        self.kubectl("apply", "-f", str(path))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        done = self.kubectl(
            "get", kind, name, "-n", namespace or self.namespace, "-o", "json", check=False
        )
        return dict(json.loads(done.stdout)) if done.returncode == 0 else None

    def wait_phase(self, name: str, phases: set[str], timeout: float = 180) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status = ((self.get("session", name) or {}).get("status")) or {}
            return status if status.get("phase") in phases else None

        return wait_for(
            f"session {name} in {sorted(phases)}", probe, timeout, lambda: self.diagnose(name)
        )

    def pod_ip(self, pod: str) -> str | None:
        found = self.get("pod", pod) or {}
        return (found.get("status") or {}).get("podIP")

    def exec(
        self, pod: str, container: str, *argv: str, namespace: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.kubectl(
            "exec",
            pod,
            "-n",
            namespace or self.namespace,
            "-c",
            container,
            "--",
            *argv,
            check=False,
            timeout=60,
        )

    def operator_pod(self) -> str:
        done = self.kubectl(
            "get",
            "pods",
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            f"app.kubernetes.io/name=corral-operator,app.kubernetes.io/instance={RELEASE}",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        )
        return done.stdout.strip()

    def probe(
        self, pod: str, container: str, kind: str, where: str, namespace: str | None = None
    ) -> str:
        done = self.exec(pod, container, "python3", "-c", PROBE, kind, where, namespace=namespace)
        return (done.stdout.strip() or done.stderr.strip()).splitlines()[-1]

    def secret_values(self, session: str) -> list[str]:
        import base64

        secret = self.get("secret", f"corral-{session}-wire") or {}
        return [base64.b64decode(v).decode() for v in (secret.get("data") or {}).values()]

    def diagnose(self, session: str) -> str:
        """What a failure message needs: the Session's status, the pod, the operator's log."""
        parts = [f"status: {((self.get('session', session) or {}).get('status'))}"]
        pod = self.get("pod", f"corral-{session}")
        if pod is not None:
            parts.append(f"pod status: {json.dumps(pod.get('status'))[-2500:]}")
            for container in ("checkout", "harness", "tools", "custodian"):
                logs = self.kubectl(
                    "logs", f"corral-{session}", "-n", self.namespace, "-c", container,
                    check=False,
                )  # fmt: skip
                parts.append(f"--- {container}\n{(logs.stdout or logs.stderr)[-1500:]}")
        operator = self.kubectl(
            "logs", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=corral-operator",
            "--tail", "60", check=False,
        )  # fmt: skip
        parts.append(f"--- operator\n{(operator.stdout or operator.stderr)[-4000:]}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ the scripted model

    def load_script(self, script: dict[str, Any]) -> None:
        load_script(self.model_url, script)

    def model_requests(self, conversation: str) -> list[dict[str, Any]]:
        return model_requests(self.model_url, conversation)

    def tool_results(self, conversation: str) -> list[str]:
        """The tool results the model received, in order (from its last request)."""
        requests = self.model_requests(conversation)
        assert requests, f"the model saw no request of {conversation}"
        return tool_results(requests)


def agent_doc(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "identity": "You are a careful coding agent.",
        "model": "corral-scripted",
        "tools": {"allow": ["bash", "read"]},
    }
    body.update(spec)
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": AGENT},
        "spec": body,
    }


def session_doc(name: str, repo: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agentRef": AGENT,
        "task": "Say that the task is done.",
        "workspace": {"repo": repo, "ref": "main"},
        "keepSandbox": True,
    }
    body.update(spec)
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "Session",
        "metadata": {"name": name},
        "spec": body,
    }


def restricted_pod(name: str, namespace: str, image: str, command: list[str]) -> dict[str, Any]:
    """A plain pod that passes Pod Security `restricted` and has no NetworkPolicy of its own."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": command,
                    "resources": {
                        "requests": {"cpu": "10m", "memory": "32Mi"},
                        "limits": {"memory": "128Mi"},
                    },
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65534,
                        "runAsGroup": 65534,
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                }
            ],
        },
    }


@contextlib.contextmanager
def installed(target: Target) -> Iterator[Corral]:
    """Serve the repository and the model on this host, install the chart, yield; then remove
    all of it (the namespace and the release too, on a cluster that outlives the run)."""
    work = Path(tempfile.mkdtemp(prefix="corral-node-e2e-"))
    host = target.host_ip
    repos = work / "repos"
    rstack.git_repository(repos / "work" / "repo", {"README.md": "# the node tier's repo\n"})
    servers: list[_Refuser] = []
    corral: Corral | None = None
    archive_claim: str | None = None
    processes: list[subprocess.Popen[bytes]] = []
    try:
        git_port = rstack.free_port(host)
        processes.append(rstack.start_git_daemon(repos, host, git_port, work / "git-daemon.log"))
        model_port = rstack.free_port(host)
        script = work / "script.yaml"
        script.write_text(yaml.safe_dump({"default": [{"text": "Done."}]}))
        processes.append(rstack.start_scripted_model(host, model_port, script, work / "model.log"))
        refuser = _Refuser((host, 0), _Hello)
        threading.Thread(target=refuser.serve_forever, daemon=True).start()
        forbidden_port = int(refuser.server_address[1])
        # A destination an Agent may name: on this host, under a name only the gateway knows.
        welcome = _Refuser((host, 0), _Hello)
        threading.Thread(target=welcome.serve_forever, daemon=True).start()
        servers = [refuser, welcome]
        corral = Corral(
            target=target,
            work=work,
            model_url=f"http://{host}:{model_port}",
            git_url=f"git://{host}:{git_port}/work/repo",
            forbidden=f"{host}:{forbidden_port}",
            allowed=f"{host}:{model_port}",
            processes=processes,
            welcome_port=int(welcome.server_address[1]),
        )
        _prepare_namespace(target, NAMESPACE)
        if target.name != "external":  # kind has a provisioner; the local node has none
            # A name of DNS characters (mkdtemp's suffix may hold "_").
            archive_claim = f"{ARCHIVE_CLAIM}-{hashlib.sha256(work.name.encode()).hexdigest()[:8]}"
            target.kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
            volume = rstack.archive_volume(
                archive_claim, OPERATOR_NAMESPACE, work / "archive", OPERATOR_UID
            )
            target.kubectl("create", "-f", "-", input=yaml.safe_dump_all(volume))
        values = rstack.chart_values(
            archive_claim=archive_claim,
            operator_image=target.operator_image,
            sandbox_image=target.sandbox_image,
            namespaces=[NAMESPACE],
            model_url=corral.model_url,
            platform_egress=[f"{host}/32:{model_port},{git_port}"],
            wire_wait_seconds=5,
            # This host stands in for the internet: its address is not refused as private,
            # and WELCOME_HOST resolves to it (at the gateway only: sandboxes have no DNS).
            gateway_allow=[f"{host}/32"],
            gateway_hosts={WELCOME_HOST: [host]},
        )
        rstack.helm_install(target.helm, target.kubeconfig, RELEASE, values)
        yield corral
    finally:
        if corral is not None:
            with contextlib.suppress(Exception):
                target.kubectl(
                    "delete", "sessions", "--all", "-n", NAMESPACE, "--wait=false", check=False
                )
            with contextlib.suppress(Exception):
                subprocess.run(
                    [str(target.helm), "uninstall", RELEASE, "--kubeconfig", str(target.kubeconfig),
                     "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout", "60s"],
                    capture_output=True, timeout=90, check=False,
                )  # fmt: skip
            with contextlib.suppress(Exception):
                target.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
            if archive_claim is not None:
                target.kubectl("delete", "pvc", archive_claim, "-n", OPERATOR_NAMESPACE,
                               "--wait=false", check=False)  # fmt: skip
                target.kubectl("delete", "pv", f"{OPERATOR_NAMESPACE}-{archive_claim}",
                               "--wait=false", check=False)  # fmt: skip
        for server in servers:
            server.shutdown()
            server.server_close()
        for proc in processes:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        subprocess.run(["rm", "-rf", str(work)], check=False)


def _prepare_namespace(target: Target, name: str) -> None:
    """`name` fresh, with Pod Security `restricted` enforced, and its default ServiceAccount."""
    if target.kubectl("get", "namespace", name, check=False).returncode == 0:
        target.kubectl("delete", "namespace", name, "--timeout=120s", timeout=150)
    target.kubectl("create", "namespace", name)
    target.kubectl(
        "label", "namespace", name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip

    def has_default_sa() -> bool:
        return (
            target.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        )

    wait_for(f"the default ServiceAccount in {name}", has_default_sa, 30)
