"""Start one container process for the local node: its own mount namespace, its identity.

The node (running as root) runs `python -I -S _node_sandbox.py SPEC.json` with the container's
log as stdout; this reads and deletes SPEC.json (written 0600 by the node), then:

1. `unshare(CLONE_NEWNS)` and makes every mount private, so nothing below leaks to the host;
2. opens each bind source (O_PATH) while the host's tree is still visible;
3. applies the mount plan: fresh tmpfs over the hidden paths (the node's workdir with every
   pod's volumes, /root, /tmp), then binds back exactly this container's volumes and what a
   process needs to run (the Python installation, the venv, the sources), read-only where
   asked, at their own host paths. A bind marked `owned` (the node's `--share` directories,
   which stand in for a git server) is an idmapped, read-only mount on which root's files
   show as the container user's, so it can read them whatever their host modes;
4. drops the capability bounding set to the container's, clears ambient capabilities, sets
   supplementary groups, gid and uid (all three ids: the kernel then clears the permitted and
   effective sets of a non-root uid), and no_new_privs when allowPrivilegeEscalation is false;
5. chdirs to the working directory and execs the container's command with its environment.

Standard library only, and nothing imported from the project: it runs with `-I -S` before its
identity is dropped, so nothing from the container's environment or volumes is loaded as root.
On failure it writes one line to the log and exits 127, which the node reports as the exit code.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import stat
import struct
import sys
from typing import Any

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # x86_64 and arm64 alike
OPEN_TREE_CLONE, AT_EMPTY_PATH, AT_RECURSIVE, AT_FDCWD = 0x1, 0x1000, 0x8000, -100
MOUNT_ATTR_RDONLY, MOUNT_ATTR_IDMAP, MOVE_MOUNT_F_EMPTY_PATH = 0x1, 0x100000, 0x4
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
EXIT_SETUP_FAILED = 127


class SetupError(Exception):
    pass


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.syscall.restype = ctypes.c_long
_ulong = ctypes.c_ulong
_libc.prctl.argtypes = [ctypes.c_int, _ulong, _ulong, _ulong, _ulong]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)} (errno {errno})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode() if source is not None else None,
            target.encode(),
            fstype.encode() if fstype is not None else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {source or fstype} on {target}",
    )


def _prctl(option: int, arg: int = 0, what: str = "prctl") -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), what)


def _mountpoint(target: str, is_dir: bool) -> None:
    """Make `target` exist (on the tmpfs that hides its parents) so something can go on it."""
    if os.path.lexists(target):
        return
    os.makedirs(target if is_dir else os.path.dirname(target), mode=0o755, exist_ok=True)
    if not is_dir:
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))


def _user_namespace(uid: int, gid: int) -> int:
    """An fd of a user namespace mapping its root to `uid`:`gid` (for an idmapped mount)."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child only holds the namespace open until the parent has its fd
        os.close(ready_r)
        os.close(done_w)
        os.write(ready_w, b"1" if _libc.unshare(CLONE_NEWUSER) == 0 else b"0")
        os.read(done_r, 1)
        os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise SetupError("unshare(CLONE_NEWUSER) failed")
        for name, host_id in (("uid_map", uid), ("gid_map", gid)):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(f"0 {host_id} 1\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.write(done_w, b"1")
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


def _syscall(number: int, *args: Any) -> int:
    wide = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = int(_libc.syscall(ctypes.c_long(number), *wide))
    if result < 0:
        errno = ctypes.get_errno()
        raise SetupError(f"syscall {number}: {os.strerror(errno)} (errno {errno})")
    return result


def _bind_owned(fd: int, target: str, userns: int) -> None:
    """`fd`'s tree at `target`, read-only and idmapped through `userns`."""
    tree = _syscall(
        SYS_OPEN_TREE, fd, b"", OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE
    )
    try:
        attr = ctypes.create_string_buffer(
            struct.pack("QQQQ", MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY, 0, 0, userns), 32
        )
        _syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH | AT_RECURSIVE, attr, 32)
        _syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH)
    finally:
        os.close(tree)


def isolate(plan: list[dict[str, Any]], owner: tuple[int, int] | None) -> None:
    userns = None
    if owner is not None and any(op.get("owned") for op in plan):
        userns = _user_namespace(*owner)
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    sources: dict[str, int] = {}
    for op in plan:
        if op["kind"] == "bind" and op["source"] not in sources:
            try:
                sources[op["source"]] = os.open(op["source"], os.O_PATH | os.O_CLOEXEC)
            except OSError as e:
                raise SetupError(f"bind source {op['source']}: {e.strerror}") from e
    for op in plan:
        target = op["target"]
        if op["kind"] == "tmpfs":
            _mountpoint(target, is_dir=True)
            mode = f"mode={op['mode']:o}"
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, mode)
            continue
        fd = sources[op["source"]]
        _mountpoint(target, is_dir=stat.S_ISDIR(os.fstat(fd).st_mode))
        if op.get("owned") and userns is not None:
            _bind_owned(fd, target, userns)
            continue
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        if op["readOnly"]:
            kept = os.statvfs(target).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
    for fd in sources.values():
        os.close(fd)
    if userns is not None:
        os.close(userns)


def become(spec: dict[str, Any]) -> None:
    keep = spec.get("capabilities")
    if keep is not None:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
        for cap in range(last + 1):
            if cap not in keep:
                _prctl(PR_CAPBSET_DROP, cap, f"dropping capability {cap}")
        # A kernel without ambient capabilities has none to clear.
        with contextlib.suppress(SetupError):
            _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, "clearing ambient capabilities")
    identity = spec.get("identity")
    if identity is not None:
        uid, gid = int(identity["uid"]), int(identity["gid"])
        os.setgroups([int(g) for g in identity["groups"]])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    if spec.get("noNewPrivs"):
        _prctl(PR_SET_NO_NEW_PRIVS, 1, "setting no_new_privs")
    os.umask(0o022)


def main(argv: list[str]) -> int:
    try:
        with open(argv[1]) as f:
            spec: dict[str, Any] = json.load(f)
        os.unlink(argv[1])
        if spec.get("mounts") is not None:
            identity = spec.get("identity")
            owner = (int(identity["uid"]), int(identity["gid"])) if identity else None
            isolate(spec["mounts"], owner)
        become(spec)
        os.chdir(spec["cwd"])
        os.execve(spec["executable"], spec["argv"], spec["env"])
    except (SetupError, OSError, ValueError, KeyError, IndexError) as e:
        print(f"corral local node: the container could not start: {e}", file=sys.stderr)
        return EXIT_SETUP_FAILED
    return EXIT_SETUP_FAILED  # not reached: execve does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv))
