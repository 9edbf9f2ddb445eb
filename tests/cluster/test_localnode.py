"""The local node against the real API server: binding, init containers, readiness on the
pod's own loopback IP, env from fieldRef and secretKeyRef, a projected service-account token
the API server accepts, restart policy, and processes killed when the pod is deleted. Run as
root (as here), each container runs as its own uid in its own mount namespace, seeing only its
own volumes, owned as the kubelet owns them; a node that cannot switch users refuses such pods.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral_dev.controlplane import ControlPlane

from ._node_fixtures import TEST_REPOS, LocalNodeHandle

pytestmark = pytest.mark.timeout(90)

RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def container(name: str, command: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": "corral/ignored:latest",
        "command": command,
        "securityContext": RESTRICTED,
        **extra,
    }


def field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


CREDS_TOKEN = {"name": "creds", "key": "token"}
SETTINGS_MODE = {"name": "settings", "key": "mode"}
MARKER = {"path": "/marker.txt", "port": "http"}


def pod_manifest(name: str, namespace: str, containers: list[dict[str, Any]], **spec: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 5,
                "containers": containers,
                **spec,
            },
        }
    )


def get_pod(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    done = cp.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
    if done.returncode != 0:
        return None
    pod: dict[str, Any] = json.loads(done.stdout)
    return pod


def wait_for(
    what: str, probe: Callable[[], Any], timeout: float = 30, node: LocalNodeHandle | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = node.log.read_text()[-3000:] if node else ""
            raise AssertionError(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.1)


def pod_ready(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    pod = get_pod(cp, namespace, name)
    conditions = {
        c["type"]: c["status"] for c in (pod or {}).get("status", {}).get("conditions", [])
    }
    return pod if conditions.get("Ready") == "True" else None


def test_a_pod_runs_init_then_serves_on_its_own_ip_with_env_from_secrets_and_fields(
    control_plane: ControlPlane, namespace: str, local_node: LocalNodeHandle
) -> None:
    control_plane.kubectl(
        "create", "secret", "generic", "creds", "-n", namespace, "--from-literal=token=s3cr3t"
    )
    control_plane.kubectl(
        "create", "configmap", "settings", "-n", namespace, "--from-literal=mode=fast"
    )
    serve = (
        "import json,os,sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'));"
        "os.execvp('python', ['python', '-m', 'http.server', '--bind', os.environ['POD_IP'],"
        " '8080', '--directory', sys.argv[2]])"
    )
    manifest = pod_manifest(
        "web",
        namespace,
        [
            container(
                "server",
                ["python", "-c", serve, "/data/env.json", "/data"],
                env=[
                    field_env("POD_IP", "status.podIP"),
                    field_env("POD_NAME", "metadata.name"),
                    field_env("POD_NS", "metadata.namespace"),
                    {"name": "SECRET", "valueFrom": {"secretKeyRef": CREDS_TOKEN}},
                    {"name": "DATA_DIR", "value": "/data/sub"},
                    {"name": "MODE", "valueFrom": {"configMapKeyRef": SETTINGS_MODE}},
                    {"name": "CREDS_FILE", "value": "/etc/creds/token"},
                ],
                volumeMounts=[
                    {"name": "data", "mountPath": "/data"},
                    {"name": "creds", "mountPath": "/etc/creds", "readOnly": True},
                ],
                ports=[{"name": "http", "containerPort": 8080}],
                readinessProbe={"httpGet": MARKER, "periodSeconds": 1},
            )
        ],
        initContainers=[
            container(
                "prepare",
                ["sh", "-c", "echo prepared > /data/marker.txt"],
                volumeMounts=[{"name": "data", "mountPath": "/data"}],
            )
        ],
        volumes=[
            {"name": "data", "emptyDir": {}},
            {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400}},
        ],
    )
    control_plane.kubectl("apply", "-f", "-", input=manifest)
    pod = wait_for("web Ready", lambda: pod_ready(control_plane, namespace, "web"), node=local_node)

    status = pod["status"]
    assert pod["spec"]["nodeName"] == local_node.name
    assert status["phase"] == "Running"
    ip = status["podIP"]
    assert ip.startswith("127.0.") and ip != "127.0.0.1"
    assert status["podIPs"] == [{"ip": ip}]
    assert status["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert status["containerStatuses"][0]["ready"] is True
    assert {c["type"] for c in status["conditions"]} >= {
        "PodScheduled", "Initialized", "ContainersReady", "Ready"
    }  # fmt: skip

    # It serves on its own loopback address, and the init container's file is there.
    assert httpx.get(f"http://{ip}:8080/marker.txt").text == "prepared\n"
    env = httpx.get(f"http://{ip}:8080/env.json").json()
    assert env["POD_IP"] == ip
    assert env["POD_NAME"] == "web" and env["POD_NS"] == namespace
    assert env["SECRET"] == "s3cr3t"
    data_dir = local_node.pod_dir(namespace, "web") / "volumes" / "data"
    assert env["DATA_DIR"] == f"{data_dir}/sub"  # the mount path, remapped to its host dir
    assert env["MODE"] == "fast"
    # The secret volume is a file at the remapped mount path, with the mode asked for.
    creds = Path(env["CREDS_FILE"])
    assert creds.read_text() == "s3cr3t" and oct(creds.stat().st_mode & 0o777) == "0o400"
    # A clean environment: the container's variables, PATH, HOME, HOSTNAME and nothing else.
    # (LC_CTYPE is Python's own locale coercion, PEP 538, set inside the process.)
    assert set(env) - {"LC_CTYPE"} == {
        "POD_IP", "POD_NAME", "POD_NS", "SECRET", "DATA_DIR", "MODE", "CREDS_FILE",
        "PATH", "HOME", "HOSTNAME",
    }  # fmt: skip
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def test_a_projected_service_account_token_is_one_the_api_server_accepts(
    control_plane: ControlPlane, namespace: str, local_node: LocalNodeHandle
) -> None:
    manifest = pod_manifest(
        "tokened",
        namespace,
        [
            container(
                "idle",
                ["sleep", "300"],
                volumeMounts=[
                    {"name": "sa", "mountPath": "/var/run/corral", "readOnly": True},
                    {"name": "agent", "mountPath": "/etc/agent", "readOnly": True},
                ],
            )
        ],
        volumes=[
            {"name": "agent", "configMap": {"name": "agent-spec"}},
            {
                "name": "sa",
                "projected": {
                    "defaultMode": 0o440,
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": "corral-custodian",
                                "expirationSeconds": 600,
                                "path": "token",
                            }
                        }
                    ],
                },
            },
        ],
    )
    control_plane.kubectl(
        "create", "configmap", "agent-spec", "-n", namespace, "--from-literal=model=first"
    )
    control_plane.kubectl("apply", "-f", "-", input=manifest)
    wait_for("tokened Ready", lambda: pod_ready(control_plane, namespace, "tokened"))
    volumes = local_node.pod_dir(namespace, "tokened") / "volumes"
    token_file = volumes / "sa" / "token"
    token = token_file.read_text()
    # As the kubelet writes it: every container runs as uid 10001 (its FsUserFrom), so the
    # token is 0600 and that uid's, whatever the volume's defaultMode says.
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"
    assert token_file.stat().st_uid == 10001

    # An edited ConfigMap reaches the running pod's files, as the kubelet syncs them.
    assert (volumes / "agent" / "model").read_text() == "first"
    control_plane.kubectl(
        "patch", "configmap", "agent-spec", "-n", namespace, "-p", '{"data":{"model":"second"}}'
    )
    wait_for("configMap resync", lambda: (volumes / "agent" / "model").read_text() == "second", 15)

    def review(audience: str) -> dict[str, Any]:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]},
        }
        done = control_plane.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(body))
        status: dict[str, Any] = json.loads(done.stdout)["status"]
        return status

    accepted = review("corral-custodian")
    assert accepted["authenticated"] is True
    assert accepted["user"]["username"] == f"system:serviceaccount:{namespace}:default"
    # Bound to this pod, as the kubelet binds it.
    assert accepted["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["tokened"]
    # The audience was asked for and is enforced: the token is no API-server token.
    assert not review("https://kubernetes.default.svc.cluster.local").get("authenticated")


def test_deleting_a_pod_kills_its_processes_even_one_that_ignores_sigterm(
    control_plane: ControlPlane, namespace: str, local_node: LocalNodeHandle
) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)"
    )
    manifest = pod_manifest(
        "doomed",
        namespace,
        [container("polite", ["sleep", "1000"]), container("stubborn", ["python", "-c", stubborn])],
        terminationGracePeriodSeconds=1,
    )
    control_plane.kubectl("apply", "-f", "-", input=manifest)
    pod = wait_for("doomed Ready", lambda: pod_ready(control_plane, namespace, "doomed"))
    pids = [
        int(c["containerID"].removeprefix("local://")) for c in pod["status"]["containerStatuses"]
    ]
    for pid in pids:
        os.kill(pid, 0)  # alive

    control_plane.kubectl("delete", "pod", "doomed", "-n", namespace, "--wait=false")
    wait_for("doomed removed", lambda: get_pod(control_plane, namespace, "doomed") is None, 20)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_crashing_container_with_restart_never_fails_the_pod(
    control_plane: ControlPlane, namespace: str, local_node: LocalNodeHandle
) -> None:
    manifest = pod_manifest(
        "crash", namespace, [container("boom", ["sh", "-c", "exit 3"])], restartPolicy="Never"
    )
    control_plane.kubectl("apply", "-f", "-", input=manifest)

    def failed() -> dict[str, Any] | None:
        pod = get_pod(control_plane, namespace, "crash")
        return pod if pod and pod.get("status", {}).get("phase") == "Failed" else None

    pod = wait_for("crash Failed", failed, node=local_node)
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0


def test_restart_policy_always_restarts_and_counts(
    control_plane: ControlPlane, namespace: str, local_node: LocalNodeHandle
) -> None:
    manifest = pod_manifest("flappy", namespace, [container("flap", ["sh", "-c", "exit 1"])])
    control_plane.kubectl("apply", "-f", "-", input=manifest)

    def restarted() -> dict[str, Any] | None:
        pod = get_pod(control_plane, namespace, "flappy")
        statuses = (pod or {}).get("status", {}).get("containerStatuses", [])
        return pod if statuses and statuses[0]["restartCount"] >= 2 else None

    pod = wait_for("two restarts", restarted, timeout=20)
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 1


def test_a_pod_that_runs_to_completion_succeeds(
    control_plane: ControlPlane, namespace: str, local_node: LocalNodeHandle
) -> None:
    manifest = pod_manifest(
        "job", namespace, [container("work", ["true"])], restartPolicy="OnFailure"
    )
    control_plane.kubectl("apply", "-f", "-", input=manifest)

    def succeeded() -> dict[str, Any] | None:
        pod = get_pod(control_plane, namespace, "job")
        return pod if pod and pod.get("status", {}).get("phase") == "Succeeded" else None

    pod = wait_for("job Succeeded", succeeded)
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"


def test_a_failing_init_container_with_restart_never_fails_the_pod_before_any_container(
    control_plane: ControlPlane, namespace: str, local_node: LocalNodeHandle
) -> None:
    manifest = pod_manifest(
        "badinit",
        namespace,
        [container("never", ["sh", "-c", "touch /data/main-ran; sleep 100"],
                   volumeMounts=[{"name": "data", "mountPath": "/data"}])],
        initContainers=[container("checkout", ["sh", "-c", "echo no repo >&2; exit 128"])],
        volumes=[{"name": "data", "emptyDir": {}}],
        restartPolicy="Never",
    )  # fmt: skip
    control_plane.kubectl("apply", "-f", "-", input=manifest)

    def failed() -> dict[str, Any] | None:
        pod = get_pod(control_plane, namespace, "badinit")
        return pod if pod and pod.get("status", {}).get("phase") == "Failed" else None

    pod = wait_for("badinit Failed", failed, node=local_node)
    init = pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
    assert init["exitCode"] == 128
    initialized = [c for c in pod["status"]["conditions"] if c["type"] == "Initialized"]
    assert initialized[0]["status"] == "False"
    pod_dir = local_node.pod_dir(namespace, "badinit")
    assert not (pod_dir / "volumes" / "data" / "main-ran").exists()
    assert "no repo" in (pod_dir / "logs" / "checkout.log").read_text()


async def test_the_node_as_a_library_runs_pods_and_kills_them_when_it_stops(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    from corral_dev.localnode import LocalNode

    node = LocalNode(control_plane.kubeconfig, tmp_path / "node", node_name="corral-second-node")
    running = asyncio.create_task(node.run())
    manifest = pod_manifest(
        "pinned",
        namespace,
        [container("idle", ["sleep", "300"])],
        # Only the second node fits; the session's node leaves the pod alone.
        nodeSelector={"kubernetes.io/hostname": "corral-second-node"},
    )
    await asyncio.to_thread(control_plane.kubectl, "apply", "-f", "-", input=manifest)

    async def ready() -> dict[str, Any]:
        while True:
            pod = await asyncio.to_thread(pod_ready, control_plane, namespace, "pinned")
            if pod:
                return pod
            await asyncio.sleep(0.1)

    pod = await asyncio.wait_for(ready(), timeout=30)
    assert pod["spec"]["nodeName"] == "corral-second-node"
    pid = int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("local://"))
    os.kill(pid, 0)
    await node.stop()
    await asyncio.wait_for(running, timeout=15)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# ------------------------------------------------------------- identities and mount isolation

FS_GROUP = 10000

# Container A: its id, its own secret, a file in its private volume and one in the shared one.
OWNER_SCRIPT = """
import json, os, subprocess, time
out = {"id": subprocess.run(["id"], capture_output=True, text=True).stdout.strip(),
       "uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups())}
out["secret"] = open(os.environ["CREDS"]).read()
open(os.environ["PRIVATE"] + "/p.txt", "w").write("private")
open(os.environ["SHARED"] + "/from-a.txt", "w").write("a")
open(os.environ["OUTBOX"] + "/note.txt", "w").write("for b")
for shared_tmp in ("/tmp", "/var/tmp", "/dev/shm"):
    open(shared_tmp + "/from-a", "w").write("a")
json.dump(out, open(os.environ["SHARED"] + "/a.tmp", "w"))
os.rename(os.environ["SHARED"] + "/a.tmp", os.environ["SHARED"] + "/a.json")
time.sleep(300)
"""

# Container B, another uid: everything it should not reach, by the host paths it can work out.
PROBE_SCRIPT = """
import errno, json, os, pathlib, subprocess, time
shared = pathlib.Path(os.environ["SHARED"])
view = pathlib.Path(os.environ["VIEW"])
volumes = shared.parent
def attempt(do):
    try:
        do()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
while not (shared / "a.json").exists():
    time.sleep(0.05)
out = {"id": subprocess.run(["id"], capture_output=True, text=True).stdout.strip(),
       "uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups())}
out["secret"] = attempt(lambda: open(volumes / "creds" / "token").read())
out["private"] = attempt(lambda: os.listdir(volumes / "private"))
out["private_file"] = attempt(lambda: open(volumes / "private" / "p.txt").read())
out["write_shared"] = attempt(lambda: (shared / "from-b.txt").write_text("b"))
out["read_view"] = attempt(lambda: (view / "from-a.txt").read_text())
out["write_view"] = attempt(lambda: (view / "x.txt").write_text("x"))
inbox = pathlib.Path(os.environ["INBOX"])
out["read_inbox"] = attempt(lambda: (inbox / "note.txt").read_text())
out["write_inbox"] = attempt(lambda: (inbox / "reply.txt").write_text("x"))
out["kubeconfig"] = attempt(lambda: open(os.environ["KUBECONFIG_PATH"]).read())
out["pods"] = sorted(os.listdir(volumes.parent.parent))
out["root"] = sorted(os.listdir("/root"))
out["tmp"] = sorted(os.listdir("/tmp"))
out["shared_tmp"] = sorted(os.listdir("/var/tmp")) + sorted(os.listdir("/dev/shm"))
# One PID namespace on the local node, but another uid's /proc/<pid>/environ stays closed.
environ = {}
for status in pathlib.Path("/proc").glob("[0-9]*/status"):
    try:
        lines = status.read_text().splitlines()
    except OSError:
        continue
    uid = int(next(l for l in lines if l.startswith("Uid:")).split()[1])
    if uid == 10001:
        environ[status.parent.name] = attempt(lambda: (status.parent / "environ").read_bytes())
out["environ"] = environ
json.dump(out, open(shared / "b.tmp", "w"))
os.rename(shared / "b.tmp", shared / "b.json")
time.sleep(300)
"""


def test_containers_run_as_their_own_uids_and_see_only_their_own_volumes(
    control_plane: ControlPlane, namespace: str, local_node: LocalNodeHandle
) -> None:
    control_plane.kubectl(
        "create", "secret", "generic", "creds", "-n", namespace, "--from-literal=token=s3cr3t"
    )
    identity_a = {**RESTRICTED, "runAsUser": 10001, "runAsGroup": 10001}
    identity_b = {**RESTRICTED, "runAsUser": 10002, "runAsGroup": 10002}
    manifest = pod_manifest(
        "split",
        namespace,
        [
            container(
                "owner",
                ["python", "-c", OWNER_SCRIPT],
                securityContext=identity_a,
                env=[
                    {"name": "CREDS", "value": "/etc/creds/token"},
                    {"name": "PRIVATE", "value": "/private"},
                    {"name": "SHARED", "value": "/shared"},
                    {"name": "OUTBOX", "value": "/outbox"},
                    {"name": "SECRET", "valueFrom": {"secretKeyRef": CREDS_TOKEN}},
                ],
                volumeMounts=[
                    {"name": "shared", "mountPath": "/shared"},
                    {"name": "private", "mountPath": "/private"},
                    {"name": "outbox", "mountPath": "/outbox"},
                    {"name": "creds", "mountPath": "/etc/creds", "readOnly": True},
                ],
            ),
            container(
                "prober",
                ["python", "-c", PROBE_SCRIPT],
                securityContext=identity_b,
                env=[
                    {"name": "SHARED", "value": "/shared"},
                    {"name": "VIEW", "value": "/view"},
                    {"name": "INBOX", "value": "/inbox"},
                    {"name": "KUBECONFIG_PATH", "value": str(control_plane.kubeconfig)},
                ],
                volumeMounts=[
                    {"name": "shared", "mountPath": "/shared"},
                    # The shared volume again, read-only.
                    {"name": "shared", "mountPath": "/view", "readOnly": True},
                    # What A writes, read-only here.
                    {"name": "outbox", "mountPath": "/inbox", "readOnly": True},
                ],
            ),
        ],
        securityContext={"fsGroup": FS_GROUP, "runAsNonRoot": True},
        volumes=[
            {"name": "shared", "emptyDir": {}},
            {"name": "private", "emptyDir": {}},
            {"name": "outbox", "emptyDir": {}},
            {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o440}},
        ],
    )
    control_plane.kubectl("apply", "-f", "-", input=manifest)

    def results() -> tuple[dict[str, Any], dict[str, Any]] | None:
        try:
            shared = local_node.pod_dir(namespace, "split") / "volumes" / "shared"
            a, b = (shared / "a.json").read_text(), (shared / "b.json").read_text()
        except FileNotFoundError:
            return None
        return json.loads(a), json.loads(b)

    a, b = wait_for("both containers' findings", results, node=local_node)
    pod_dir = local_node.pod_dir(namespace, "split")
    volumes = pod_dir / "volumes"

    # Each container runs as its own uid and gid, with the pod's fsGroup as a supplementary
    # group, and `id` says so.
    assert (a["uid"], a["gid"]) == (10001, 10001) and FS_GROUP in a["groups"]
    assert (b["uid"], b["gid"]) == (10002, 10002) and FS_GROUP in b["groups"]
    assert a["id"].startswith("uid=10001 gid=10001 ") and str(FS_GROUP) in a["id"]
    assert b["id"].startswith("uid=10002 gid=10002 ") and str(FS_GROUP) in b["id"]

    # A reads its own secret; B, which does not mount it, cannot even find it, nor A's
    # private volume, nor the cluster's kubeconfig.
    assert a["secret"] == "s3cr3t"
    assert b["secret"] in ("ENOENT", "EACCES")
    assert b["private"] in ("ENOENT", "EACCES") and b["private_file"] in ("ENOENT", "EACCES")
    assert b["kubeconfig"] in ("ENOENT", "EACCES")
    # The node's workdir shows B only its own pod; /root only what a process needs to run;
    # /tmp is B's own, empty but for the mount points of its volumes' host paths.
    assert b["pods"] == [pod_dir.name]
    assert set(b["root"]) <= {".pyenv", ".cache"}
    assert set(b["tmp"]) <= _tmp_mount_points(local_node.workdir)
    # The host's world-writable directories are each container's own: no channel through them.
    assert "from-a" not in b["shared_tmp"]
    assert not any(Path(d, "from-a").exists() for d in ("/tmp", "/var/tmp", "/dev/shm"))
    # Another uid's environment (A holds SECRET) is closed to B through /proc.
    assert b["environ"] and set(b["environ"].values()) == {"EACCES"}

    # The shared emptyDir: both write. A read-only mount reads but refuses writes, whether
    # of a volume another container writes or of one this container also mounts read-write.
    assert b["write_shared"] == "ok"
    assert b["read_inbox"] == "ok" and b["write_inbox"] == "EROFS"
    assert b["read_view"] == "ok" and b["write_view"] == "EROFS"
    assert (volumes / "outbox" / "note.txt").read_text() == "for b"

    # Ownership as the kubelet gives it: the emptyDir 2777 root:fsGroup, so a file A writes
    # there has the fsGroup as its group; the secret file keeps 0440 and has the fsGroup.
    shared = (volumes / "shared").stat()
    assert oct(shared.st_mode & 0o7777) == "0o2777" and shared.st_gid == FS_GROUP
    from_a = (volumes / "shared" / "from-a.txt").stat()
    assert (from_a.st_uid, from_a.st_gid) == (10001, FS_GROUP)
    from_b = (volumes / "shared" / "from-b.txt").stat()
    assert (from_b.st_uid, from_b.st_gid) == (10002, FS_GROUP)
    token = (volumes / "creds" / "token").stat()
    assert oct(token.st_mode & 0o777) == "0o440" and token.st_gid == FS_GROUP
    assert (volumes / "private" / "p.txt").stat().st_uid == 10001


def test_a_shared_repository_is_read_only_and_clonable_by_any_uid(
    control_plane: ControlPlane, namespace: str, local_node: LocalNodeHandle
) -> None:
    # Made as git_repo makes them: root's, mode 0700, in the directory the node shares.
    TEST_REPOS.mkdir(parents=True, exist_ok=True)
    repo = Path(tempfile.mkdtemp(prefix="repo-", dir=TEST_REPOS))
    try:
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
        subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
        (repo / "README.md").write_text("hello\n")
        subprocess.run([*git, "add", "README.md"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "first commit"], check=True)
        script = (
            'set -u; git clone -q "$1" /work/clone && git -C /work/clone log --format=%s'
            ' > /work/log.txt; touch "$1/planted" 2>/work/touch.txt; echo done > /work/done'
        )
        manifest = pod_manifest(
            "cloner",
            namespace,
            [
                container(
                    "clone",
                    ["sh", "-c", script, "clone", str(repo)],
                    securityContext={**RESTRICTED, "runAsUser": 10002, "runAsGroup": 10002},
                    env=[{"name": "HOME", "value": "/work"}],
                    volumeMounts=[{"name": "work", "mountPath": "/work"}],
                )
            ],
            volumes=[{"name": "work", "emptyDir": {}}],
            restartPolicy="Never",
        )
        control_plane.kubectl("apply", "-f", "-", input=manifest)

        def done() -> Path | None:
            try:
                work = local_node.pod_dir(namespace, "cloner") / "volumes" / "work"
            except FileNotFoundError:
                return None
            return work if (work / "done").exists() else None

        work = wait_for("the clone", done, node=local_node)
        # Cloned as uid 10002, though the repository is root's and 0700 on the host: the
        # node shows it as a git server would serve it. But it cannot be written.
        assert (work / "log.txt").read_text() == "first commit\n"
        assert (work / "clone" / "README.md").stat().st_uid == 10002
        assert "Read-only file system" in (work / "touch.txt").read_text()
        assert not (repo / "planted").exists()
    finally:
        shutil.rmtree(repo, ignore_errors=True)


async def test_a_node_that_cannot_switch_users_refuses_a_pod_that_asks_for_one(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    from corral_dev.localnode import LocalNode

    # root=False: the node behaves as one started by an ordinary user.
    node = LocalNode(
        control_plane.kubeconfig, tmp_path / "node", node_name="corral-plain-node", root=False
    )
    running = asyncio.create_task(node.run())
    manifest = pod_manifest(
        "wants-uid",
        namespace,
        [container("idle", ["sleep", "300"])],
        nodeSelector={"kubernetes.io/hostname": "corral-plain-node"},
    )
    await asyncio.to_thread(control_plane.kubectl, "apply", "-f", "-", input=manifest)

    async def failed() -> dict[str, Any]:
        while True:
            pod = await asyncio.to_thread(get_pod, control_plane, namespace, "wants-uid")
            if pod and pod.get("status", {}).get("phase") == "Failed":
                return pod
            await asyncio.sleep(0.1)

    try:
        pod = await asyncio.wait_for(failed(), timeout=30)
    finally:
        await node.stop()
        await asyncio.wait_for(running, timeout=15)
    status = pod["status"]
    assert status["reason"] == "UnsupportedIdentity"
    assert "runAsUser 10001" in status["message"]
    assert "cannot switch users" in status["message"]
    waiting = status["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerConfigError"
    assert not list((tmp_path / "node" / "pods").glob("*/logs/*.log"))  # nothing ran


# ------------------------------------------------- the node's pure parts (no cluster needed)


def test_mount_paths_are_remapped_as_whole_paths_only() -> None:
    from corral_dev._node_spec import remap

    mounts = [("/workspace", "/tmp/p/ws"), ("/workspace/cache", "/tmp/p/c"), ("/w", "/tmp/p/w")]
    assert remap("/workspace/a.txt", mounts) == "/tmp/p/ws/a.txt"
    assert remap("/workspace/cache/x", mounts) == "/tmp/p/c/x"  # the nested mount wins
    assert remap("--root=/workspace", mounts) == "--root=/tmp/p/ws"
    assert remap("/workspaces/other", mounts) == "/workspaces/other"  # not a whole prefix
    assert remap("/w", mounts) == "/tmp/p/w"
    assert remap("http://x/workspace", mounts) == "http://x/workspace"


def test_env_resolution_refuses_missing_secrets_with_a_reason() -> None:
    from corral_dev._node_spec import ContainerConfigError, PodFacts, container_env

    facts = PodFacts("p", "ns", "u", "default", "node", "127.0.9.9", "127.0.0.1")
    container = {
        "env": [
            {"name": "A", "value": "x"},
            {"name": "B", "value": "$(A)-$(NOPE)-$$(A)"},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ]
    }
    env = container_env(container, facts, {"s": {"k": "v"}}, {})
    assert env == {"A": "x", "B": "x-$(NOPE)-$(A)", "IP": "127.0.9.9", "K": "v"}
    with pytest.raises(ContainerConfigError, match="has no key 'k'"):
        container_env(container, facts, {"s": {}}, {})
    with pytest.raises(ContainerConfigError, match="Secret 's' not found"):
        container_env(container, facts, {}, {})
    maybe = {"name": "s", "key": "k", "optional": True}
    optional = {"env": [{"name": "K", "valueFrom": {"secretKeyRef": maybe}}]}
    assert container_env(optional, facts, {}, {}) == {}


def test_pod_phase_follows_init_and_containers() -> None:
    from corral_dev._node_spec import ContainerRun, pod_phase

    def run(state: str, code: int | None = None) -> ContainerRun:
        return ContainerRun("c", "i", state=state, exit_code=code, reason="")

    assert pod_phase([run("running")], [ContainerRun("c", "i")], "Always", False) == "Pending"
    assert pod_phase([run("terminated", 0)], [run("running")], "Always", False) == "Running"
    assert pod_phase([], [run("terminated", 0), run("terminated", 0)], "Never", False) == (
        "Succeeded"
    )
    assert pod_phase([], [run("terminated", 0), run("terminated", 2)], "Never", False) == "Failed"
    assert pod_phase([run("terminated", 1)], [], "Never", True) == "Failed"


def test_loopback_addresses_are_unique_and_never_the_host() -> None:
    from corral_dev.localnode import LoopbackPool

    pool = LoopbackPool(seed=7)
    taken = [pool.take() for _ in range(600)]
    assert len(set(taken)) == 600
    assert all(a.startswith("127.0.") and a != "127.0.0.1" for a in taken)
    assert all(0 < int(a.split(".")[3]) < 255 for a in taken)
    # A pod restarted by a new node keeps the address it reported; the host's is never given.
    assert pool.take("127.0.77.5") == "127.0.77.5"
    assert pool.take("127.0.77.5") != "127.0.77.5"
    assert pool.take("127.0.0.1") != "127.0.0.1"
    pool.give_back("127.0.77.5")
    assert pool.take("127.0.77.5") == "127.0.77.5"


def _tmp_mount_points(workdir: Path) -> set[str]:
    """What a container's fresh /tmp may hold: the mount points of what the node binds back
    under it (its workdir's pod volumes, and the sources, venv and Python installation when a
    clone or an interpreter lives under /tmp), each an entry of /tmp's first level."""
    bound = (workdir, Path(__file__).resolve().parents[2], Path(sys.prefix), Path(sys.base_prefix))
    names = set()
    for path in bound:
        parts = path.resolve().parts
        if len(parts) > 2 and parts[:2] == ("/", "tmp"):
            names.add(parts[2])
    return names

