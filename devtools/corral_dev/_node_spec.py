"""Pure parts of the local node: a container's environment, path remapping, probes and the pod
status the API server gets. No I/O here; `_node_pod` does the running.
"""

from __future__ import annotations

import base64
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
