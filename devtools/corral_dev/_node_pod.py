"""One pod on the local node: its volumes as host directories, its containers as processes.

Init containers run in order, then every container at once; each is restarted per the pod's
restartPolicy; readiness comes from httpGet probes on the pod's own loopback IP; every change
is written to the pod's status subresource. A process gets only its container's environment,
PATH (the project's venv first) and HOME, with each mount path rewritten to its host directory.

As root, volumes are owned as the kubelet owns them (emptyDir 0777, API data files with their
modes; with an fsGroup, group-owned by it with the group bits and setgid the kubelet adds), and
each process starts through `_node_sandbox`: its own mount namespace showing only its own
volumes, its securityContext's uid, gid and groups, its capability bounding set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import httpx

from corral_api.timestamps import now_rfc3339
from corral_kube import KubeClient, KubeError, NotFound

from ._node_host import NodeHost
from ._node_spec import (
    API_VOLUME_DIR_MODE,
    EMPTY_DIR_MODE,
    ContainerConfigError,
    ContainerRun,
    PodFacts,
    container_env,
    container_security,
    expand_vars,
    field_value,
    fs_group_mode,
    fs_user,
    identity_refusal,
    pod_phase,
    pod_status,
    probe_url,
    referenced_objects,
    remap,
    restart_wanted,
    secret_data,
    token_mode,
)

log = logging.getLogger("corral.localnode")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
MAX_BACKOFF = 10.0
VOLUME_SYNC_SECONDS = 5.0
DEFAULT_FILE_MODE = 0o644  # the API's default for secret, configMap and projected volumes


def _mode(source: dict[str, Any]) -> int:
    return int(source.get("defaultMode", DEFAULT_FILE_MODE))


class Owner:
    """Who owns a pod's volume files: the fsGroup (group) and, for projected service-account
    tokens, the fsUser (the kubelet's FsUserFrom). None for each when unset or not root."""

    def __init__(self, fs_group: int | None = None, fs_user: int | None = None) -> None:
        self.fs_group = fs_group
        self.fs_user = fs_user

    def file_mode(self, mode: int) -> int:
        """An API data file's mode: the kubelet adds group read for the fsGroup."""
        if self.fs_group is None:
            return mode
        return fs_group_mode(mode, is_dir=False, read_only=True)

    def own_dir(self, path: Path, mode: int, *, read_only: bool) -> None:
        """Give a volume directory its mode, and the fsGroup (setgid, group bits) when set."""
        if self.fs_group is not None:
            os.chown(path, -1, self.fs_group)
            mode = fs_group_mode(mode, is_dir=True, read_only=read_only)
        os.chmod(path, mode)


def _write_atomic(
    path: Path, data: bytes, mode: int = 0o644, *, uid: int | None = None, gid: int | None = None
) -> None:
    with contextlib.suppress(OSError):
        st = path.stat()
        if (
            path.read_bytes() == data
            and st.st_mode & 0o7777 == mode
            and (uid is None or st.st_uid == uid)
            and (gid is None or st.st_gid == gid)
        ):
            return  # unchanged: a periodic refresh leaves the file alone
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    if uid is not None or gid is not None:
        os.chown(tmp, -1 if uid is None else uid, -1 if gid is None else gid)
    tmp.chmod(mode)  # after chown, which clears set-id bits
    os.replace(tmp, path)


class PodRunner:
    def __init__(
        self,
        kube: KubeClient,
        pod: dict[str, Any],
        *,
        node_name: str,
        pod_ip: str,
        host_ip: str,
        pod_dir: Path,
        host: NodeHost,
    ) -> None:
        self.kube = kube
        self.pod = pod
        meta = pod["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.uid: str = meta["uid"]
        self.spec: dict[str, Any] = pod["spec"]
        self.pod_ip = pod_ip
        self.host_ip = host_ip
        self.dir = pod_dir
        self.host = host
        self.venv_bin = host.venv_bin
        self.facts = PodFacts(
            name=self.name,
            namespace=self.namespace,
            uid=self.uid,
            service_account=self.spec.get("serviceAccountName", "default"),
            node_name=node_name,
            pod_ip=pod_ip,
            host_ip=host_ip,
            labels=meta.get("labels") or {},
            annotations=meta.get("annotations") or {},
        )
        self.restart_policy: str = self.spec.get("restartPolicy", "Always")
        self.init_runs = [
            ContainerRun(c["name"], c.get("image", "")) for c in self.spec.get("initContainers", [])
        ]
        self.main_runs = [
            ContainerRun(c["name"], c.get("image", "")) for c in self.spec.get("containers", [])
        ]
        self.init_failed = False
        self.start_time = now_rfc3339()
        self.volumes: dict[str, Path] = {}
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self.stopping = False
        self.gone = False  # the pod object no longer exists
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._conditions: list[dict[str, Any]] = []
        self._tokens: list[tuple[Path, dict[str, Any], int, int]] = []
        self.refused: tuple[str, str] | None = None  # (reason, message): the node cannot run it
        fs_group = (self.spec.get("securityContext") or {}).get("fsGroup")
        self.owner = Owner(
            int(fs_group) if fs_group is not None and host.root else None,
            fs_user(self.spec) if host.root else None,
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._status_writer(), name=f"status {self.key}"))
        self._tasks.append(asyncio.create_task(self._run(), name=f"pod {self.key}"))

    # ------------------------------------------------------------------------------- lifecycle

    def _refusal(self) -> str | None:
        """Why this node cannot run the pod as asked (an identity only root can take)."""
        for container in [*self.spec.get("initContainers", []), *self.spec.get("containers", [])]:
            try:
                security = container_security(self.spec, container)
            except ContainerConfigError:
                continue  # reported per container, as the kubelet does
            why = identity_refusal(
                security, self.host.uid, self.host.gid, can_switch=self.host.root
            )
            if why:
                return f"container {container['name']!r}: {why}"
        return None

    async def _run(self) -> None:
        refusal = self._refusal()
        if refusal is not None:
            log.warning("pod %s refused: %s", self.key, refusal)
            self.refused = ("UnsupportedIdentity", refusal)
            for run in self.init_runs + self.main_runs:
                run.reason, run.message = "CreateContainerConfigError", refusal
            self._dirty.set()
            return
        while True:
            # Retried like the kubelet does: a Secret or the root CA ConfigMap may come later.
            try:
                self._tokens.clear()
                await self._prepare_volumes()
                break
            except (ContainerConfigError, KubeError, OSError) as e:
                log.warning("pod %s: volumes not ready: %s", self.key, e)
                for run in self.init_runs + self.main_runs:
                    run.reason, run.message = "CreateContainerConfigError", str(e)
                self._dirty.set()
                await asyncio.sleep(1.0)
        for target, source, expiry, mode in self._tokens:
            self._tasks.append(
                asyncio.create_task(self._refresh_token(target, source, expiry, mode))
            )
        self._tasks.append(asyncio.create_task(self._refresh_volumes()))
        for container, run in zip(self.spec.get("initContainers", []), self.init_runs, strict=True):
            if not await self._supervise(container, run, init=True):
                if not self.stopping:
                    self.init_failed = True
                    self._dirty.set()
                return
        self._dirty.set()
        await asyncio.gather(
            *(
                self._supervise(c, r, init=False)
                for c, r in zip(self.spec.get("containers", []), self.main_runs, strict=True)
            )
        )

    async def stop(self, grace: float) -> None:
        """Kill every process: SIGTERM to its group, SIGKILL after `grace` seconds."""
        self.stopping = True
        for process in list(self.processes.values()):
            _signal_group(process, signal.SIGTERM)
        waits = [p.wait() for p in self.processes.values() if p.returncode is None]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout=max(grace, 0.1))
        for process in list(self.processes.values()):
            _signal_group(process, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                await process.wait()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --------------------------------------------------------------------------------- volumes

    async def _prepare_volumes(self, *, refresh: bool = False) -> None:
        """Fill each volume's host directory; `refresh` rewrites only Secret and ConfigMap data,
        as the kubelet does periodically, so an edited object reaches a running pod."""
        for volume in self.spec.get("volumes", []):
            name = volume["name"]
            target = self.dir / "volumes" / name
            fresh = not target.exists()
            target.mkdir(parents=True, exist_ok=True)
            self.volumes[name] = target
            if "emptyDir" in volume:
                if fresh and self.host.root:
                    self.owner.own_dir(target, EMPTY_DIR_MODE, read_only=False)
                continue
            if fresh and self.host.root:
                self.owner.own_dir(target, API_VOLUME_DIR_MODE, read_only=True)
            if "secret" in volume:
                source = volume["secret"]
                await self._write_object(
                    target, "secrets", source.get("secretName"), source, _mode(source)
                )
            elif "configMap" in volume:
                source = volume["configMap"]
                await self._write_object(
                    target, "configmaps", source.get("name"), source, _mode(source)
                )
            elif "projected" in volume:
                mode = _mode(volume["projected"])
                for source in volume["projected"].get("sources", []):
                    await self._write_projection(target, source, mode, refresh=refresh)
            elif "downwardAPI" in volume:
                if not refresh:
                    self._write_downward(
                        target, volume["downwardAPI"], _mode(volume["downwardAPI"])
                    )
            else:
                kinds = sorted(k for k in volume if k != "name")
                raise ContainerConfigError(f"volume {name}: {kinds} is not supported locally")

    async def _refresh_volumes(self) -> None:
        while not self.stopping:
            await asyncio.sleep(VOLUME_SYNC_SECONDS)
            try:
                await self._prepare_volumes(refresh=True)
            except (ContainerConfigError, KubeError, OSError) as e:
                log.warning("pod %s: volume refresh failed: %s", self.key, e)

    async def _object_data(self, plural: str, name: str, optional: bool) -> dict[str, str] | None:
        path = f"/api/v1/namespaces/{self.namespace}/{plural}/{name}"
        try:
            obj = await self.kube.request("GET", path)
        except NotFound:
            if optional:
                return None
            raise
        if plural == "secrets":
            return secret_data(obj)
        return dict(obj.get("data") or {})

    async def _write_object(
        self, target: Path, plural: str, name: str | None, source: dict[str, Any], mode: int
    ) -> None:
        if not name:
            raise ContainerConfigError(f"a {plural} volume needs a name")
        data = await self._object_data(plural, name, bool(source.get("optional")))
        if data is None:
            return
        items = source.get("items")
        pairs = [(i["key"], i["path"], int(i.get("mode", mode))) for i in items] if items else [
            (k, k, mode) for k in data
        ]  # fmt: skip
        for key, path, file_mode in pairs:
            if key not in data:
                raise ContainerConfigError(f"{plural} {name!r} has no key {key!r}")
            self._write_file(target, path, data[key].encode(), file_mode)

    async def _write_projection(
        self, target: Path, source: dict[str, Any], mode: int, *, refresh: bool
    ) -> None:
        if "serviceAccountToken" in source:
            if not refresh:  # tokens have their own refresh, at 80% of their life
                token_source = source["serviceAccountToken"]
                expiry = await self._write_token(target, token_source, mode)
                self._tokens.append((target, token_source, expiry, mode))
        elif "secret" in source:
            secret = source["secret"]
            await self._write_object(target, "secrets", secret.get("name"), secret, mode)
        elif "configMap" in source:
            cm = source["configMap"]
            await self._write_object(target, "configmaps", cm.get("name"), cm, mode)
        elif "downwardAPI" in source:
            if not refresh:
                self._write_downward(target, source["downwardAPI"], mode)
        else:
            raise ContainerConfigError(f"projected source {sorted(source)} is not supported")

    async def _write_token(self, target: Path, source: dict[str, Any], mode: int) -> int:
        """A TokenRequest for the pod's service account, bound to this pod, as asked."""
        expiry = int(source.get("expirationSeconds", 3600))
        audiences = [source["audience"]] if source.get("audience") else []
        account = self.facts.service_account
        answer = await self.kube.request(
            "POST",
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "audiences": audiences,
                    "expirationSeconds": expiry,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": self.name,
                        "uid": self.uid,
                    },
                },
            },
        )
        mode = self.owner.file_mode(token_mode(mode, self.owner.fs_user, self.owner.fs_group))
        _write_atomic(
            target / source["path"],
            answer["status"]["token"].encode(),
            mode,
            uid=self.owner.fs_user,
            gid=self.owner.fs_group,
        )
        return expiry

    async def _refresh_token(
        self, target: Path, source: dict[str, Any], expiry: int, mode: int
    ) -> None:
        # The kubelet refreshes at 80% of a token's life; so does the local node.
        while not self.stopping:
            await asyncio.sleep(expiry * 0.8)
            try:
                expiry = await self._write_token(target, source, mode)
            except KubeError as e:
                log.warning("pod %s: token refresh failed: %s", self.key, e)

    def _write_downward(self, target: Path, source: dict[str, Any], mode: int) -> None:
        for item in source.get("items", []):
            if "fieldRef" not in item:
                raise ContainerConfigError("downwardAPI: only fieldRef items are supported")
            value = field_value(self.facts, item["fieldRef"]["fieldPath"])
            self._write_file(target, item["path"], value.encode(), int(item.get("mode", mode)))

    def _write_file(self, volume: Path, relative: str, data: bytes, mode: int) -> None:
        """An API data file (secret, configMap, downwardAPI), owned for the pod's fsGroup."""
        path = volume / relative
        if not path.parent.exists() and self.host.root:
            path.parent.mkdir(parents=True)
            for parent in [path.parent, *path.parent.parents]:
                if parent == volume:
                    break
                self.owner.own_dir(parent, API_VOLUME_DIR_MODE, read_only=True)
        _write_atomic(path, data, self.owner.file_mode(mode), gid=self.owner.fs_group)

    # ------------------------------------------------------------------------------ containers

    def _mounts(self, container: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
        """(mountPath, host path, source directory, read-only) for each of the container's
        volumeMounts. API data volumes (secret, configMap, projected, downwardAPI) are always
        read-only, as the kubelet mounts them. The host path is the source directory, except
        for a read-only mount of a directory this container also mounts read-write: in its
        mount namespace that one is a read-only bind at a path of its own."""
        kinds = {v["name"]: v for v in self.spec.get("volumes", [])}
        mounts: list[tuple[str, str, str, bool]] = []
        for index, mount in enumerate(container.get("volumeMounts", [])):
            host = self.volumes.get(mount["name"])
            if host is None:
                raise ContainerConfigError(f"volumeMount {mount['name']!r} names no volume")
            api_data = "emptyDir" not in kinds.get(mount["name"], {})
            if mount.get("subPath"):
                host = host / mount["subPath"]
                if not host.exists():
                    host.mkdir(parents=True)
                    if self.host.root and not api_data:
                        self.owner.own_dir(host, EMPTY_DIR_MODE, read_only=False)
            read_only = bool(mount.get("readOnly")) or api_data
            view = self.dir / "views" / container["name"] / str(index)
            mounts.append((mount["mountPath"], str(view), str(host), read_only))
        writable = {source for _, _, source, read_only in mounts if not read_only}
        return [
            (path, view if self.host.root and read_only and source in writable else source,
             source, read_only)
            for path, view, source, read_only in mounts
        ]  # fmt: skip

    async def _environment(self, container: dict[str, Any]) -> dict[str, str]:
        secret_names, config_map_names = referenced_objects({"spec": {"containers": [container]}})
        secrets: dict[str, dict[str, str]] = {}
        config_maps: dict[str, dict[str, str]] = {}
        for name in secret_names:
            data = await self._object_data("secrets", name, optional=True)
            if data is not None:
                secrets[name] = data
        for name in config_map_names:
            data = await self._object_data("configmaps", name, optional=True)
            if data is not None:
                config_maps[name] = data
        return container_env(container, self.facts, secrets, config_maps)

    async def _spawn(
        self, container: dict[str, Any], run: ContainerRun
    ) -> asyncio.subprocess.Process:
        security = container_security(self.spec, container)
        why = identity_refusal(security, self.host.uid, self.host.gid, can_switch=self.host.root)
        if why:
            raise ContainerConfigError(why)
        volume_mounts = self._mounts(container)
        mounts = [(path, host) for path, host, _, _ in volume_mounts]
        env = {k: remap(v, mounts) for k, v in (await self._environment(container)).items()}
        argv = [
            remap(expand_vars(str(a), env), mounts)
            for a in [*container.get("command", []), *container.get("args", [])]
        ]
        if not container.get("command"):
            raise ContainerConfigError(
                "the local node ignores images, so every container needs a command"
            )
        home = self.dir / "home" / container["name"]
        home.mkdir(parents=True, exist_ok=True)
        if self.host.root and security.uid is not None:
            os.chown(home, security.uid, security.gid if security.gid is not None else 0)
            home.chmod(0o700)

        def search_path(exec_dir: Path | None) -> str:
            first = [str(self.venv_bin), *([str(exec_dir)] if exec_dir else [])]
            return ":".join([*first, env.get("PATH") or SYSTEM_PATH])

        # The exec service's binary goes on PATH once known; a command that is not found
        # without it (corral-exec itself) waits for it.
        exec_dir = self.host.exec_dir_now()
        path = search_path(exec_dir)
        executable = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=path)
        if executable is None and exec_dir is None:
            exec_dir = await self.host.exec_dir()
            path = search_path(exec_dir)
            executable = shutil.which(argv[0], path=path)
        if executable is None:
            raise ContainerConfigError(
                f"executable {argv[0]!r} not found on {path}{self.host.missing_hint()}"
            )
        process_env = {"HOSTNAME": self.name, "HOME": str(home), **env, "PATH": path}
        cwd = remap(container["workingDir"], mounts) if container.get("workingDir") else str(home)
        Path(cwd).mkdir(parents=True, exist_ok=True)
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        command = [executable, *argv[1:]]
        if self.host.root:
            # Its own mount namespace with only its volumes, and its own identity.
            binds = [(source, host_path, ro) for _, host_path, source, ro in volume_mounts]
            binds.append((str(home), str(home), False))
            plan = self.host.plan(binds, exec_dir)
            spec = self.host.sandbox_spec(
                security=security,
                plan=plan,
                executable=executable,
                argv=command,
                env=process_env,
                cwd=cwd,
            )
            spec_file = self.dir / "run" / f"{container['name']}.json"
            self.host.write_spec(spec_file, spec)
            command, process_env = self.host.launcher(spec_file), {}
        with (logs / f"{container['name']}.log").open("ab") as out:
            return await asyncio.create_subprocess_exec(
                command[0],
                *command[1:],
                env=process_env,
                cwd=cwd if not self.host.root else "/",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group, so a kill takes its children
            )

    async def _supervise(self, container: dict[str, Any], run: ContainerRun, *, init: bool) -> bool:
        """Run one container to its end; True when it finished well (init) or was stopped."""
        backoff = 1.0
        policy = "OnFailure" if init and self.restart_policy == "Always" else self.restart_policy
        while not self.stopping:
            try:
                process = await self._spawn(container, run)
            except (ContainerConfigError, KubeError, OSError) as e:
                run.state, run.reason, run.message = "waiting", "CreateContainerConfigError", str(e)
                self._dirty.set()
                if policy == "Never" and isinstance(e, OSError):
                    return False
                await asyncio.sleep(2.0)
                continue
            self.processes[run.name] = process
            run.state, run.reason, run.message = "running", "", ""
            run.pid, run.started_at, run.exit_code = process.pid, now_rfc3339(), None
            probe = container.get("readinessProbe") if not init else None
            run.ready = probe is None and not init
            self._dirty.set()
            prober = asyncio.create_task(self._probe(container, probe, run)) if probe else None
            code = await process.wait()
            _signal_group(process, signal.SIGKILL)  # leftovers of the container go with it
            if prober is not None:
                prober.cancel()
            if self.stopping:
                return True
            run.state, run.ready, run.exit_code = "terminated", False, code
            run.reason = "Completed" if code == 0 else "Error"
            run.finished_at = now_rfc3339()
            self._dirty.set()
            if not restart_wanted(policy, code):
                return code == 0 or not init
            run.last_terminated = run.wire()["state"]["terminated"]
            run.restart_count += 1
            run.state, run.reason = "waiting", "CrashLoopBackOff"
            self._dirty.set()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
        return True

    async def _probe(
        self, container: dict[str, Any], probe: dict[str, Any], run: ContainerRun
    ) -> None:
        try:
            url = probe_url(container, probe, self.pod_ip)
        except ContainerConfigError as e:
            run.message = str(e)
            self._dirty.set()
            return
        period = float(probe.get("periodSeconds", 10))
        timeout = float(probe.get("timeoutSeconds", 1))
        need_ok = int(probe.get("successThreshold", 1))
        need_fail = int(probe.get("failureThreshold", 3))
        oks = fails = 0
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        async with httpx.AsyncClient(timeout=timeout, verify=False) as http:
            while True:
                try:
                    ok = 200 <= (await http.get(url)).status_code < 400
                except httpx.HTTPError:
                    ok = False
                oks, fails = (oks + 1, 0) if ok else (0, fails + 1)
                if not run.ready and oks >= need_ok:
                    run.ready = True
                    self._dirty.set()
                elif run.ready and fails >= need_fail:
                    run.ready = False
                    self._dirty.set()
                # Probe fast until first ready, so tests do not wait a full period for it.
                await asyncio.sleep(period if run.ready else min(period, 0.2))

    # ---------------------------------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        phase = pod_phase(self.init_runs, self.main_runs, self.restart_policy, self.init_failed)
        if self.refused is not None:
            phase = "Failed"
        status = pod_status(
            phase=phase,
            pod_ip=self.pod_ip,
            host_ip=self.host_ip,
            start_time=self.start_time,
            now=now_rfc3339(),
            init=self.init_runs,
            main=self.main_runs,
            previous_conditions=self._conditions,
        )
        self._conditions = status["conditions"]
        if self.refused is not None:
            status["reason"], status["message"] = self.refused
        return status

    async def _status_writer(self) -> None:
        last: str | None = None
        self._dirty.set()
        while not self.stopping:
            await self._dirty.wait()
            await asyncio.sleep(0.02)  # let a burst of changes land in one write
            self._dirty.clear()
            if self.stopping:
                return
            status = self.status()
            text = json.dumps(status, sort_keys=True)
            if text == last:
                continue
            try:
                await self.kube.request(
                    "PATCH",
                    f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status",
                    body={"metadata": {"uid": self.uid}, "status": status},
                    content_type="application/merge-patch+json",
                )
                last = text
            except NotFound:
                self.gone = True
                return
            except KubeError as e:
                log.warning("pod %s: status update failed: %s", self.key, e)
                await asyncio.sleep(0.5)
                self._dirty.set()


def _signal_group(process: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
