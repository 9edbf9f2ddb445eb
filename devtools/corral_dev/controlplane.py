"""A real local Kubernetes control plane: etcd, kube-apiserver and kube-controller-manager.

The binaries come from `hack/build-control-plane.sh` (pinned release, built from the Go module
proxy, cached under ~/.cache/corral). Authentication is by client certificates signed by a CA
made for this control plane, so a test can mint a kubeconfig for any user and groups; RBAC
authorization and Pod Security Admission are on, as in a production cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ports import free_port as free_port  # re-exported: tests and benchmarks call it from here

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-control-plane.sh"
# kind (as kubectl names it) -> API path prefix, plural, namespaced: what `get_object` reads.
THROTTLED_RETRIES = 10  # 429s in a row before a call to the API server fails
CORRAL_PLURALS = ("agents", "approvals", "evidences", "freezes", "goals", "sessions")
RESOURCES: dict[str, tuple[str, str, bool]] = {
    **{
        k: ("apis/corral.dev/v1alpha1", plural, True)
        for plural in CORRAL_PLURALS
        for k in (plural, plural[:-1])
    },
    **{
        k: ("api/v1", plural, True)
        for plural in ("pods", "secrets", "events", "configmaps", "serviceaccounts", "services")
        for k in (plural, plural[:-1])
    },
    "namespace": ("api/v1", "namespaces", False),
    "node": ("api/v1", "nodes", False),
    "networkpolicy": ("apis/networking.k8s.io/v1", "networkpolicies", True),
    "networkpolicies": ("apis/networking.k8s.io/v1", "networkpolicies", True),
    "lease": ("apis/coordination.k8s.io/v1", "leases", True),
    "poddisruptionbudget": ("apis/policy/v1", "poddisruptionbudgets", True),
    "poddisruptionbudgets": ("apis/policy/v1", "poddisruptionbudgets", True),
}

CLUSTER_SCOPED = frozenset(
    {
        "ClusterRole",
        "ClusterRoleBinding",
        "Namespace",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "CustomResourceDefinition",
        "PriorityClass",
        "StorageClass",
    }
)


def _plural(kind: str) -> str:
    lower = kind.lower()
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    if lower.endswith(("s", "ss")):
        return lower + "es"
    return lower + "s"


# Services (and so the `kubernetes` Service's 198.19.0.1) in 198.18.0.0/15, the benchmarking
# range: a pod on the real node never sends traffic to a private range.
SERVICE_CIDR = "198.19.0.0/16"
API_SERVICE_IP = "198.19.0.1"  # the first address of SERVICE_CIDR
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"


class ControlPlaneError(Exception):
    """The control plane could not be built or started."""


def binaries() -> Path:
    """Build (first time only) and return the directory holding the pinned binaries."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ControlPlaneError(f"building the control plane failed:\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed: {done.stderr}")


@dataclass
class ControlPlane:
    state_dir: Path
    bin_dir: Path
    server: str
    ca_file: Path
    kubeconfig: Path
    sa_key: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _tls: ssl.SSLContext | None = field(default=None, repr=False, compare=False)
    _minted: dict[str, tuple[tuple[str, ...], Path]] = field(
        default_factory=dict, repr=False, compare=False
    )

    # ------------------------------------------------------------------ identities

    def user_kubeconfig(self, username: str, groups: list[str] | None = None) -> Path:
        """A kubeconfig for `username` in `groups`; it can do only what RBAC grants. The same
        identity asked for again is the one minted before (each test's operator asks)."""
        minted = self._minted.get(username)
        if minted is not None and minted[0] == tuple(groups or ()) and minted[1].exists():
            return minted[1]
        pki = self.state_dir / "pki"
        safe = "".join(c if c.isalnum() else "-" for c in username)
        key, csr, crt = (pki / f"user-{safe}.{ext}" for ext in ("key", "csr", "crt"))
        subject = "/CN=" + username.replace("/", r"\/")
        for group in groups or []:
            subject += "/O=" + group.replace("/", r"\/")
        # P-256, not RSA: a test mints several identities, and RSA keys are slow to make
        # (docs/performance.md, "Test rig"); the API server takes either.
        _openssl(
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", str(key), cwd=pki,
        )  # fmt: skip
        _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr), cwd=pki)
        _openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            str(crt),
            "-days",
            "30",
            cwd=pki,
        )
        path = self.state_dir / f"kubeconfig-{safe}"
        path.write_text(_kubeconfig(self.server, self.ca_file, crt, key, username))
        path.chmod(0o600)
        self._minted[username] = (tuple(groups or ()), path)
        return path

    # ------------------------------------------------------------------ reads

    def get_object(
        self, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """One object, read as the admin straight from the API server (None when it does not
        exist): what `kubectl get KIND NAME -o json` answers, without a process. Tests poll
        with it many times a second, and a kubectl process each time costs CPU
        (docs/performance.md, "Test rig")."""
        resource = RESOURCES.get(kind.lower())
        if resource is None:
            raise ValueError(f"no API path known for kind {kind!r}: use kubectl")
        prefix, plural, namespaced = resource
        where = f"/namespaces/{namespace}" if namespaced and namespace else ""
        return self.api_get(f"/{prefix}{where}/{plural}/{name}")

    def list_objects(
        self, kind: str, namespace: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """The items of a list (`kubectl get KIND [-n NS] [--field-selector S] -o json`)."""
        resource = RESOURCES.get(kind.lower())
        if resource is None:
            raise ValueError(f"no API path known for kind {kind!r}: use kubectl")
        prefix, plural, namespaced = resource
        where = f"/namespaces/{namespace}" if namespaced and namespace else ""
        query = f"?fieldSelector={urllib.parse.quote(field_selector)}" if field_selector else ""
        found = self.api_get(f"/{prefix}{where}/{plural}{query}")
        return list((found or {}).get("items") or [])

    def apply_object(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of one object as the admin (what `kubectl apply` does for a fresh
        or unchanged object, without a process, its discovery and its OpenAPI download)."""
        api_version, kind = doc["apiVersion"], doc["kind"]
        prefix = f"api/{api_version}" if "/" not in api_version else f"apis/{api_version}"
        plural = _plural(kind)
        meta = doc.get("metadata") or {}
        where = (
            "" if kind in CLUSTER_SCOPED else f"/namespaces/{meta.get('namespace') or 'default'}"
        )
        path = f"/{prefix}{where}/{plural}/{meta['name']}?fieldManager=corral-tests&force=true"
        try:
            applied = self.api_send("PATCH", path, doc, "application/apply-patch+yaml")
        except urllib.error.HTTPError as e:
            raise ControlPlaneError(
                f"applying {kind} {meta.get('name')}: {e.code} {e.read().decode(errors='replace')}"
            ) from None
        if applied is None:
            raise ControlPlaneError(f"applying {kind} {meta.get('name')}: 404 (no such namespace?)")
        return applied

    def api_get(self, path: str) -> dict[str, Any] | None:
        """GET `path` on the API server as the admin; None on 404."""
        return self.api_send("GET", path)

    def api_send(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any] | None:
        """`method` on `path` as the admin, with `body` as JSON; the answer, None on 404."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(
            f"{self.server}{path}", data=data, method=method, headers=headers
        )
        for attempt in range(THROTTLED_RETRIES + 1):
            try:
                with urllib.request.urlopen(
                    request, context=self._admin_tls(), timeout=30
                ) as answer:
                    return dict(json.loads(answer.read()))
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return None
                # A fresh API server answers 429 until its priority-and-fairness configuration
                # is in place; kubectl waits and asks again, and so does this.
                if e.code != 429 or attempt == THROTTLED_RETRIES:
                    raise
                time.sleep(min(float(e.headers.get("Retry-After") or 1), 5.0))
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ namespaces

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """A namespace with `labels`, in one request (two kubectl processes before)."""
        meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
        self.api_send("POST", "/api/v1/namespaces", {"metadata": meta})

    def release_namespace(self, name: str) -> None:
        """Delete a test's namespace so that it is really gone. Corral's objects carry the
        operator's finalizer, and a test's operator has stopped by now: left alone, the
        namespace stays Terminating and the namespace controller lists every resource type
        in it again and again for the rest of the run, most of the API server's and etcd's
        CPU in a long tier (docs/performance.md, "Test rig"). So the finalizers go too."""
        self.api_send("DELETE", f"/api/v1/namespaces/{name}")
        for plural in CORRAL_PLURALS:
            found = self.api_get(f"/apis/corral.dev/v1alpha1/namespaces/{name}/{plural}")
            for item in (found or {}).get("items") or []:
                meta = item.get("metadata") or {}
                if meta.get("finalizers"):
                    self.api_send(
                        "PATCH",
                        f"/apis/corral.dev/v1alpha1/namespaces/{name}/{plural}/{meta['name']}",
                        {"metadata": {"finalizers": None}},
                        "application/merge-patch+json",
                    )

    def _admin_tls(self) -> ssl.SSLContext:
        if self._tls is None:
            pki = self.state_dir / "pki"
            context = ssl.create_default_context(cafile=str(self.ca_file))
            context.load_cert_chain(pki / "user-corral-admin.crt", pki / "user-corral-admin.key")
            self._tls = context
        return self._tls

    # ------------------------------------------------------------------ commands

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig or self.kubeconfig)]
        done = subprocess.run(
            [*cmd, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(
                done.returncode, done.args, output=done.stdout, stderr=done.stderr
            )
        return done

    def env(self) -> dict[str, str]:
        """Environment for child processes that should talk to this control plane."""
        path = f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path}

    def stop(self) -> None:
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.processes.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _kubeconfig(server: str, ca: Path, crt: Path, key: Path, user: str) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "corral", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": user, "user": {"client-certificate": str(crt), "client-key": str(key)}}],
        "contexts": [{"name": "corral", "context": {"cluster": "corral", "user": user}}],
        "current-context": "corral",
    }
    return json.dumps(config, indent=2)


def _make_pki(pki: Path) -> None:
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=pki)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-subj",
        "/CN=corral-local-ca",
        "-days",
        "30",
        "-out",
        "ca.crt",
        cwd=pki,
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    # Serving certificate for 127.0.0.1 and the in-cluster names.
    (pki / "serving.cnf").write_text(
        "[req]\ndistinguished_name=dn\n[dn]\n[ext]\n"
        f"subjectAltName=IP:127.0.0.1,IP:{API_SERVICE_IP},DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
        "DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl("genrsa", "-out", "serving.key", "2048", cwd=pki)
    _openssl(
        "req",
        "-new",
        "-key",
        "serving.key",
        "-subj",
        "/CN=kube-apiserver",
        "-out",
        "serving.csr",
        cwd=pki,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "serving.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "serving.crt",
        "-days",
        "30",
        "-extfile",
        "serving.cnf",
        "-extensions",
        "ext",
        cwd=pki,
    )


def _wait_ready(
    url: str,
    ca: Path,
    cert: Path,
    key: Path,
    proc: subprocess.Popen[bytes],
    log: Path,
    timeout: float,
) -> None:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(cert), str(key))
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ControlPlaneError(f"{url} exited early:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last = str(exc)
        time.sleep(0.2)
    raise ControlPlaneError(
        f"{url} not ready after {timeout}s ({last}):\n{log.read_text()[-4000:]}"
    )


# Audit at Metadata level, one line per finished request: who called what (benchmarks count
# the operator's own requests with it).
_AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
"""


# The controllers a cluster of Corral's objects, pods on a node and nothing else needs: default
# ServiceAccounts and their tokens, kube-root-ca.crt, owner-reference cascades, namespace
# deletion, aggregated ClusterRoles, and the status of the disruption budgets a Session's
# turn holds (an eviction waits for it). Every other controller (Deployments, Jobs, endpoints,
# quotas...) watches pods for nothing and costs the API server CPU on every pod update.
SESSION_CONTROLLERS = ",".join(
    f"{name}-controller"
    for name in (
        "serviceaccount",
        "serviceaccount-token",
        "root-ca-certificate-publisher",
        "garbage-collector",
        "namespace",
        "clusterrole-aggregation",
        "disruption",
    )
)
# The volume binder runs: the node tier's archive is a pre-bound hostPath volume, which only
# it marks Bound (there is no provisioner, so a claim without a volume stays Pending).
ALL_CONTROLLERS = (
    "*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,"
    "-service-lb-controller,-route,-attachdetach,"
    "-persistentvolume-expander,-ephemeral-volume,-pvc-protection,-pv-protection"
)


def start(
    state_dir: Path,
    *,
    controller_manager: bool = True,
    audit_log: Path | None = None,
    controllers: str = ALL_CONTROLLERS,
) -> ControlPlane:
    """Start etcd, kube-apiserver and (optionally) kube-controller-manager under `state_dir`.

    `audit_log`: where the API server writes its audit log (JSON lines), when given.
    `controllers`: the controller manager's `--controllers` (SESSION_CONTROLLERS for a plane
    that runs only Corral's objects and bare pods)."""
    bin_dir = binaries()
    state_dir.mkdir(parents=True, exist_ok=True)
    pki = state_dir / "pki"
    _make_pki(pki)
    logs = state_dir / "logs"
    logs.mkdir(exist_ok=True)
    spawn = _Spawner(bin_dir, logs)

    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    etcd_url = _start_etcd(spawn, state_dir, etcd_port, peer_port)
    server = f"https://127.0.0.1:{api_port}"
    api = _start_apiserver(spawn, state_dir, etcd_url, api_port, audit_log)

    plane = ControlPlane(
        state_dir=state_dir,
        bin_dir=bin_dir,
        server=server,
        ca_file=pki / "ca.crt",
        kubeconfig=state_dir / "kubeconfig",
        sa_key=pki / "sa.key",
        processes=spawn.processes,
    )
    try:
        _wait_apiserver_ready(plane, api, logs)
        if controller_manager:
            _start_controller_manager(plane, spawn, controllers)
    except BaseException:
        plane.stop()
        raise
    return plane


@dataclass
class _Spawner:
    """Starts a control plane binary with its output in logs/<name>.log, and keeps it in
    `processes` (the dict the `ControlPlane` stops)."""

    bin_dir: Path
    logs: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __call__(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        out = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [str(self.bin_dir / name), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = proc
        return proc


def _start_etcd(spawn: _Spawner, state_dir: Path, etcd_port: int, peer_port: int) -> str:
    """Start etcd; returns its client URL."""
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    spawn(
        "etcd",
        [
            "--data-dir",
            str(state_dir / "etcd"),
            "--listen-client-urls",
            etcd_url,
            "--advertise-client-urls",
            etcd_url,
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-cluster",
            f"default=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
        ],
    )
    return etcd_url


def _audit_args(state_dir: Path, audit_log: Path | None) -> list[str]:
    """The API server's audit flags (writing the policy they name), none without a log."""
    if audit_log is None:
        return []
    (state_dir / "audit-policy.yaml").write_text(_AUDIT_POLICY)
    return [
        "--audit-policy-file",
        str(state_dir / "audit-policy.yaml"),
        "--audit-log-path",
        str(audit_log),
        "--audit-log-format",
        "json",
        "--audit-log-maxsize",
        "0",
    ]


def _start_apiserver(
    spawn: _Spawner, state_dir: Path, etcd_url: str, api_port: int, audit_log: Path | None
) -> subprocess.Popen[bytes]:
    pki = state_dir / "pki"
    audit = _audit_args(state_dir, audit_log)
    return spawn(
        "kube-apiserver",
        [
            *audit,
            "--etcd-servers",
            etcd_url,
            "--bind-address",
            "127.0.0.1",
            "--advertise-address",
            "127.0.0.1",
            "--secure-port",
            str(api_port),
            "--tls-cert-file",
            str(pki / "serving.crt"),
            "--tls-private-key-file",
            str(pki / "serving.key"),
            "--client-ca-file",
            str(pki / "ca.crt"),
            "--service-cluster-ip-range",
            SERVICE_CIDR,
            "--service-account-issuer",
            API_AUDIENCE,
            "--service-account-key-file",
            str(pki / "sa.pub"),
            "--service-account-signing-key-file",
            str(pki / "sa.key"),
            "--api-audiences",
            f"{API_AUDIENCE},https://kubernetes.default.svc",
            "--authorization-mode",
            "RBAC",
            "--enable-admission-plugins",
            "NamespaceLifecycle,ServiceAccount,PodSecurity,"
            "LimitRanger,ResourceQuota,DefaultTolerationSeconds,MutatingAdmissionWebhook,"
            "ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,OwnerReferencesPermissionEnforcement",
            "--allow-privileged=false",
            # A node named otherwise than its address is reached by its InternalIP.
            "--kubelet-preferred-address-types",
            "InternalIP,Hostname",
            "--v",
            "1",
        ],
    )


def _wait_apiserver_ready(plane: ControlPlane, api: subprocess.Popen[bytes], logs: Path) -> None:
    """Mint the admin kubeconfig (`plane.kubeconfig`), then wait for the API server's /readyz."""
    pki = plane.state_dir / "pki"
    admin = plane.user_kubeconfig("corral-admin", ["system:masters"])
    shutil.copy(admin, plane.kubeconfig)
    _wait_ready(
        f"{plane.server}/readyz",
        pki / "ca.crt",
        pki / "user-corral-admin.crt",
        pki / "user-corral-admin.key",
        api,
        logs / "kube-apiserver.log",
        timeout=90,
    )


def _start_controller_manager(plane: ControlPlane, spawn: _Spawner, controllers: str) -> None:
    pki = plane.state_dir / "pki"
    kcm_config = plane.user_kubeconfig("system:kube-controller-manager")
    spawn(
        "kube-controller-manager",
        [
            "--kubeconfig",
            str(kcm_config),
            "--authentication-kubeconfig",
            str(kcm_config),
            "--authorization-kubeconfig",
            str(kcm_config),
            "--service-account-private-key-file",
            str(pki / "sa.key"),
            "--root-ca-file",
            str(pki / "ca.crt"),
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            str(free_port()),
            "--controllers",
            controllers,
            "--v",
            "1",
        ],
    )


def install_crds(plane: ControlPlane, crd_dir: Path = REPO_ROOT / "crds") -> None:
    plane.kubectl("apply", "--server-side", "-f", str(crd_dir))
    plane.kubectl(
        "wait",
        "--for",
        "condition=Established",
        "--timeout",
        "60s",
        "crd",
        "-l",
        "app.kubernetes.io/part-of=corral",
    )


def wait_for_default_service_account(
    plane: ControlPlane, namespace: str, timeout: float = 30
) -> None:
    """The ServiceAccount admission plugin refuses pods until the controller made `default`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if plane.get_object("serviceaccount", "default", namespace) is not None:
            return
        time.sleep(0.1)
    raise ControlPlaneError(f"no default ServiceAccount in {namespace} after {timeout}s")
