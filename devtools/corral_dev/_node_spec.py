"""Pure parts of the local node: a container's environment, path remapping, probes and the pod
status the API server gets. No I/O here; `_node_pod` does the running.
"""

from __future__ import annotations

import base64
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any


class ContainerConfigError(Exception):
    """The container cannot start as specified (a missing Secret key, an unknown field)."""


# ------------------------------------------------------------------------------ mount paths


def remap(text: str, mounts: list[tuple[str, str]]) -> str:
    """Rewrite every container mount path in `text` to its host directory.

    A mount path matches only as a whole path prefix (`/work` does not match `/workspace`).
    Longer mount paths win, so a nested mount maps to its own directory. All mounts are
    replaced in one pass: a host directory that itself looks like a mount path (a node workdir
    under /tmp when the pod mounts /tmp) is never rewritten a second time.
    """
    if not mounts:
        return text
    by_path = {(m.rstrip("/") or "/"): host for m, host in mounts}
    ordered = sorted(by_path, key=len, reverse=True)
    pattern = re.compile(
        r"(?<![A-Za-z0-9._-])("
        + "|".join(re.escape(m) for m in ordered)
        + r")(?=/|$|[^A-Za-z0-9._-])"
    )
    # A function replacement, so backslashes in the host path are taken literally.
    return pattern.sub(lambda match: by_path[match.group(1)], text)


def expand_vars(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known names expand, `$$` escapes, others stay as written."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, text)


# ------------------------------------------------------------------------------- environment


@dataclass(frozen=True)
class PodFacts:
    """What a fieldRef can read."""

    name: str
    namespace: str
    uid: str
    service_account: str
    node_name: str
    pod_ip: str
    host_ip: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


def field_value(facts: PodFacts, path: str) -> str:
    simple = {
        "metadata.name": facts.name,
        "metadata.namespace": facts.namespace,
        "metadata.uid": facts.uid,
        "spec.serviceAccountName": facts.service_account,
        "spec.nodeName": facts.node_name,
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
        "status.hostIP": facts.host_ip,
        "status.hostIPs": facts.host_ip,
    }
    if path in simple:
        return simple[path]
    labelled = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if labelled:
        source = facts.labels if labelled.group(1) == "labels" else facts.annotations
        return source.get(labelled.group(2), "")
    raise ContainerConfigError(f"fieldRef {path!r} is not supported by the local node")


def referenced_objects(pod: dict[str, Any]) -> tuple[set[str], set[str]]:
    """Names of the Secrets and ConfigMaps the pod's containers read through env."""
    secrets: set[str] = set()
    config_maps: set[str] = set()
    spec = pod.get("spec") or {}
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for var in container.get("env", []):
            source = var.get("valueFrom") or {}
            if "secretKeyRef" in source:
                secrets.add(source["secretKeyRef"]["name"])
            if "configMapKeyRef" in source:
                config_maps.add(source["configMapKeyRef"]["name"])
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                secrets.add(source["secretRef"]["name"])
            if "configMapRef" in source:
                config_maps.add(source["configMapRef"]["name"])
    return secrets, config_maps


def secret_data(secret: dict[str, Any]) -> dict[str, str]:
    return {
        k: base64.b64decode(v).decode("utf-8", "replace")
        for k, v in (secret.get("data") or {}).items()
    } | dict(secret.get("stringData") or {})


def container_env(
    container: dict[str, Any],
    facts: PodFacts,
    secrets: dict[str, dict[str, str]],
    config_maps: dict[str, dict[str, str]],
) -> dict[str, str]:
    """The container's environment as the kubelet would build it (without service links)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        if "secretRef" in source:
            data = _lookup(secrets, source["secretRef"], "Secret")
        elif "configMapRef" in source:
            data = _lookup(config_maps, source["configMapRef"], "ConfigMap")
        else:
            continue
        env.update({prefix + k: v for k, v in (data or {}).items()})
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var or "valueFrom" not in var:
            env[name] = expand_vars(str(var.get("value", "")), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_value(facts, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            value = _key(secrets, source["secretKeyRef"], "Secret")
            if value is not None:
                env[name] = value
        elif "configMapKeyRef" in source:
            value = _key(config_maps, source["configMapKeyRef"], "ConfigMap")
            if value is not None:
                env[name] = value
        else:
            raise ContainerConfigError(f"env {name}: valueFrom {sorted(source)} is not supported")
    return env


def _lookup(
    store: dict[str, dict[str, str]], ref: dict[str, Any], kind: str
) -> dict[str, str] | None:
    data = store.get(ref["name"])
    if data is None and not ref.get("optional"):
        raise ContainerConfigError(f"{kind} {ref['name']!r} not found")
    return data


def _key(store: dict[str, dict[str, str]], ref: dict[str, Any], kind: str) -> str | None:
    data = _lookup(store, ref, kind)
    if data is None:
        return None
    if ref["key"] not in data:
        if ref.get("optional"):
            return None
        raise ContainerConfigError(f"{kind} {ref['name']!r} has no key {ref['key']!r}")
    return data[ref["key"]]


# ------------------------------------------------------------------------------------ probes


def probe_url(container: dict[str, Any], probe: dict[str, Any], pod_ip: str) -> str:
    get = probe.get("httpGet")
    if not get:
        raise ContainerConfigError("only httpGet probes are supported by the local node")
    port = get["port"]
    if isinstance(port, str) and not port.isdigit():
        named = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        if port not in named:
            raise ContainerConfigError(f"probe port {port!r} is not a named container port")
        port = named[port]
    scheme = str(get.get("scheme", "HTTP")).lower()
    host = get.get("host") or pod_ip
    path = get.get("path", "/")
    return f"{scheme}://{host}:{int(port)}{path if path.startswith('/') else '/' + path}"


def restart_wanted(policy: str, exit_code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


# ------------------------------------------------------------------------------------ status


@dataclass
class ContainerRun:
    """One container's state as the node tracks it."""

    name: str
    image: str
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    restart_count: int = 0
    ready: bool = False
    pid: int | None = None
    last_terminated: dict[str, Any] | None = None

    def wire(self) -> dict[str, Any]:
        if self.state == "running":
            state: dict[str, Any] = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated":
            state = {
                "terminated": {
                    "exitCode": self.exit_code if self.exit_code is not None else -1,
                    "reason": self.reason,
                    "message": self.message,
                    "startedAt": self.started_at,
                    "finishedAt": self.finished_at,
                    "containerID": f"local://{self.pid or 0}",
                }
            }
        else:
            state = {"waiting": {"reason": self.reason, "message": self.message}}
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": f"local://{self.image}",
            "state": state,
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.state == "running",
        }
        if self.pid:
            status["containerID"] = f"local://{self.pid}"
        if self.last_terminated:
            status["lastState"] = {"terminated": self.last_terminated}
        return status


def pod_phase(
    init: list[ContainerRun], main: list[ContainerRun], restart_policy: str, init_failed: bool
) -> str:
    if init_failed:
        return "Failed"
    if any(c.state != "terminated" or c.exit_code != 0 for c in init):
        return "Pending"
    if not main or any(c.state == "waiting" and c.reason == "ContainerCreating" for c in main):
        return "Pending"
    if all(c.state == "terminated" for c in main):
        return "Succeeded" if all(c.exit_code == 0 for c in main) else "Failed"
    return "Running"


def _condition(kind: str, true: bool, now: str, reason: str = "") -> dict[str, Any]:
    condition = {"type": kind, "status": "True" if true else "False", "lastTransitionTime": now}
    if reason and not true:
        condition["reason"] = reason
    return condition


def pod_status(
    *,
    phase: str,
    pod_ip: str,
    host_ip: str,
    start_time: str,
    now: str,
    init: list[ContainerRun],
    main: list[ContainerRun],
    previous_conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    initialized = all(c.state == "terminated" and c.exit_code == 0 for c in init)
    ready = phase == "Running" and all(c.ready for c in main)
    old = {c.get("type"): c for c in previous_conditions or []}

    def keep_time(condition: dict[str, Any]) -> dict[str, Any]:
        # lastTransitionTime moves only when the status flips.
        before = old.get(condition["type"])
        if before and before.get("status") == condition["status"]:
            condition["lastTransitionTime"] = before.get("lastTransitionTime", now)
        return condition

    conditions = [
        keep_time(_condition("PodScheduled", True, now)),
        keep_time(_condition("Initialized", initialized, now, "ContainersNotInitialized")),
        keep_time(_condition("ContainersReady", ready, now, "ContainersNotReady")),
        keep_time(_condition("Ready", ready, now, "ContainersNotReady")),
    ]
    status: dict[str, Any] = {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "conditions": conditions,
        "containerStatuses": [c.wire() for c in main],
    }
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if init:
        status["initContainerStatuses"] = [c.wire() for c in init]
    return status


# ----------------------------------------------------------------- identity and capabilities

# Linux capability numbers: a name's index in this tuple (linux/capability.h).
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)  # fmt: skip
# What containerd (and Docker) give a container that asks for no change.
RUNTIME_DEFAULT_CAPABILITIES = frozenset(
    {
        "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
        "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE",
    }
)  # fmt: skip


@dataclass(frozen=True)
class ContainerSecurity:
    """What a container's process runs as, from the pod's and the container's securityContext.

    `uid` None means no runAsUser anywhere: the local node then runs the process as its own
    user (the image's USER, which a real runtime would use, does not exist here)."""

    uid: int | None
    gid: int | None
    groups: tuple[int, ...]  # supplementary: fsGroup, then supplementalGroups
    no_new_privs: bool
    capabilities: frozenset[str]  # the bounding set the process keeps


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _cap_name(name: str) -> str:
    return str(name).upper().removeprefix("CAP_")


def container_capabilities(security_context: dict[str, Any]) -> frozenset[str]:
    """The bounding set as containerd builds it: the runtime's default set (everything when
    privileged), `drop: [ALL]` empties it, other drops remove, adds come last and win."""
    if security_context.get("privileged"):
        return frozenset(CAPABILITIES)
    caps = security_context.get("capabilities") or {}
    add = {_cap_name(c) for c in caps.get("add") or []}
    drop = {_cap_name(c) for c in caps.get("drop") or []}
    unknown = (add | drop) - set(CAPABILITIES) - {"ALL"}
    if unknown:
        raise ContainerConfigError(f"unknown capabilities {sorted(unknown)}")
    base = frozenset(CAPABILITIES) if "ALL" in add else RUNTIME_DEFAULT_CAPABILITIES
    kept = set() if "ALL" in drop else {c for c in base if c not in drop}
    return frozenset(kept | (add - {"ALL"}))


def container_security(pod_spec: dict[str, Any], container: dict[str, Any]) -> ContainerSecurity:
    """The effective identity of `container`: its securityContext over the pod's, as the
    kubelet's DetermineEffectiveSecurityContext merges them. Raises ContainerConfigError for
    a container the kubelet would not start (runAsNonRoot with runAsUser 0)."""
    pod_sc: dict[str, Any] = pod_spec.get("securityContext") or {}
    sc: dict[str, Any] = container.get("securityContext") or {}

    def pick(key: str) -> Any:
        return sc[key] if sc.get(key) is not None else pod_sc.get(key)

    uid = _int_or_none(pick("runAsUser"))
    gid = _int_or_none(pick("runAsGroup"))
    if pick("runAsNonRoot") and uid == 0:
        raise ContainerConfigError(
            f"container {container.get('name')!r}: runAsUser 0 breaks the runAsNonRoot policy"
        )
    groups: list[int] = []
    fs_group = _int_or_none(pod_sc.get("fsGroup"))
    for group in ([fs_group] if fs_group is not None else []) + [
        int(g) for g in pod_sc.get("supplementalGroups") or []
    ]:
        if group not in groups:
            groups.append(group)
    if uid is not None and gid is None:
        gid = 0  # a uid the image's /etc/passwd does not name gets group 0 from the runtime
    return ContainerSecurity(
        uid=uid,
        gid=gid,
        groups=tuple(groups),
        no_new_privs=sc.get("allowPrivilegeEscalation") is False,
        capabilities=container_capabilities(sc),
    )


def identity_refusal(
    security: ContainerSecurity, node_uid: int, node_gid: int, *, can_switch: bool
) -> str | None:
    """Why a node that cannot switch users (not root), running as `node_uid`:`node_gid`,
    cannot honour `security`, or None. Such a node runs no pod as someone it is not."""
    if can_switch:
        return None
    cannot = (
        f"but the local node cannot switch users: it runs as uid {node_uid}, not as root "
        "with user switching on; start the node as root"
    )
    if security.uid is not None and security.uid != node_uid:
        return f"runAsUser {security.uid} asked for, {cannot}"
    if security.uid is not None and security.gid is not None and security.gid != node_gid:
        return f"runAsGroup {security.gid} asked for, {cannot}"
    return None


def fs_user(pod_spec: dict[str, Any]) -> int | None:
    """The kubelet's FsUserFrom: the one runAsUser every container (init ones too) runs as,
    or None when one has none or two differ. It owns projected service-account tokens."""
    found: int | None = None
    for container in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:
        pod_sc = pod_spec.get("securityContext") or {}
        sc = container.get("securityContext") or {}
        uid = _int_or_none(sc.get("runAsUser", pod_sc.get("runAsUser")))
        if uid is None or (found is not None and uid != found):
            return None
        found = uid
    return found


# ------------------------------------------------------------------------------ volume modes

EMPTY_DIR_MODE = 0o777  # the kubelet creates an emptyDir 0777, whatever its umask
API_VOLUME_DIR_MODE = 0o755  # a secret/configMap/projected/downwardAPI volume's directory
RW_MASK, RO_MASK, EXEC_MASK, SETGID = 0o660, 0o440, 0o110, 0o2000


def fs_group_mode(mode: int, *, is_dir: bool, read_only: bool) -> int:
    """The mode after the kubelet's SetVolumeOwnership for an fsGroup (its
    changeFilePermission): group rw added (r for the read-only API volumes), and on
    directories group x and setgid, so new files inherit the group."""
    mask = RO_MASK if read_only else RW_MASK
    if is_dir:
        mask |= SETGID | EXEC_MASK
    return mode | mask


def token_mode(default_mode: int, fs_user_id: int | None, fs_group_id: int | None) -> int:
    """A projected service-account token's mode: 0600 when the pod has an fsUser or fsGroup
    (SetVolumeOwnership then makes it 0640 for the group), else the volume's defaultMode."""
    return 0o600 if fs_user_id is not None or fs_group_id is not None else default_mode


# ------------------------------------------------------------------------- mount namespaces


@dataclass(frozen=True)
class MountOp:
    """One step of a container's mount namespace: a fresh tmpfs over `target` (hiding what
    was there), or `source` bind-mounted at `target`; `owned`: read-only and idmapped so that
    root's files there show as the container user's."""

    kind: str  # "tmpfs" | "bind"
    target: str
    source: str = ""
    read_only: bool = False
    mode: int = 0o755
    owned: bool = False


# Never hidden, even when asked: the system the processes run on (nothing at or below these,
# nor /etc itself or anything above them).
_SYSTEM = ("/bin", "/dev", "/lib", "/lib32", "/lib64", "/proc", "/sbin", "/sys", "/usr")


# World-writable directories: each container gets its own, empty (as in a real container).
SHARED_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


def _hideable(path: str) -> bool:
    if path in SHARED_TMP_DIRS:
        return True
    return not any(_inside(path, system) or _inside(system, path) for system in _SYSTEM) and (
        not _inside("/etc", path)
    )


def _norm(path: str) -> str:
    return posixpath.normpath(path) if path.startswith("/") else posixpath.normpath("/" + path)


def _inside(path: str, parent: str) -> bool:
    """`path` is `parent` or below it."""
    return parent == "/" or path == parent or path.startswith(parent.rstrip("/") + "/")


def mount_plan(
    hide: list[str],
    binds: list[tuple[str, str, bool]],
    tmp_dirs: tuple[str, ...] = SHARED_TMP_DIRS,
    owned: tuple[str, ...] = (),
) -> list[MountOp]:
    """The steps that build a container's view: every `hide` path behind a fresh tmpfs, then
    each (source, target, read_only) bind back on top, parents before children.

    A hide that would cover the system (`/`, /usr and below, /etc...) is dropped, as is one
    already covered by another hide with no bind in between. A bind of a path onto itself that an
    identical enclosing bind already shows is dropped. A path bound twice keeps the last
    read-only flag of the most permissive kind (read-write wins), so a volume mounted twice
    stays writable where one mount asked so. `tmp_dirs` get a sticky, world-writable tmpfs.
    Binds whose target is in `owned` are read-only and owned (see MountOp).
    """
    owned = tuple(_norm(o) for o in owned)
    hides = {_norm(h) for h in hide if _hideable(_norm(h))}
    by_target: dict[str, tuple[str, bool]] = {}
    for source, target, read_only in binds:
        key = _norm(target)
        if key in by_target:
            read_only = read_only and by_target[key][1]
        by_target[key] = (_norm(source), read_only)

    def enclosing(path: str) -> tuple[str, str] | None:
        """The nearest op strictly above `path`: ("tmpfs"|"bind", its target)."""
        best: tuple[str, str] | None = None
        for other in [*hides, *by_target]:
            if other != path and _inside(path, other):
                kind = "tmpfs" if other in hides else "bind"
                if best is None or len(other) > len(best[1]):
                    best = (kind, other)
        return best

    ops: list[MountOp] = []
    for path in hides:
        above = enclosing(path)
        if above is not None and above[0] == "tmpfs":
            continue  # already hidden, and nothing bound in between brings it back
        mode = 0o1777 if path in tmp_dirs else 0o755
        ops.append(MountOp("tmpfs", path, mode=mode))
    for target, (source, read_only) in by_target.items():
        above = enclosing(target)
        if source == target and above is not None and above[0] == "bind":
            outer_source, outer_ro = by_target[above[1]]
            redundant = outer_source == above[1] and outer_ro == read_only
            if redundant and target not in hides and target not in owned:
                continue  # the enclosing identity bind shows it already
        if target in owned:
            ops.append(MountOp("bind", target, source=source, read_only=True, owned=True))
            continue
        ops.append(MountOp("bind", target, source=source, read_only=read_only))
    # Parents first; at one path the tmpfs goes before what is bound onto it.
    ops.sort(key=lambda op: (op.target.count("/") if op.target != "/" else 0, op.kind != "tmpfs",
                             op.target))  # fmt: skip
    return ops
