"""The in-process workspace's change signal without the scan: inotify, as the exec service has it.

After every command the in-process workspace told the policy whether the instruction files, the
root's entries or .git/HEAD had changed by scanning the tree (a stat per directory and per
AGENTS.md, in Python, on the step's critical path). The exec service stopped doing that with
inotify watches (ADR 0088, corral_exec/watch_linux.go); this is the same watch, with the same
rules, for `corral run`: the kernel queues an event for every change in a watched directory
as it happens, so once a command has exited one non-blocking read says whether anything that
matters moved, and only then is the tree scanned.

Directory mtimes alone could not do this: a file created in a directory changes only that
directory's mtime, and a file rewritten in place only its own, so "unchanged" needs a stat of
every directory and every AGENTS.md, which is the scan. Without inotify (another OS, no
instance left, the user's watch limit, a tree too large) every check scans, as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import struct
import sys
import threading
import weakref
from collections.abc import Iterable

# More directories than this and the tree is scanned after every command instead: each watch
# holds kernel memory, and the user's watches are shared with everything else it runs.
MAX_WATCHED_DIRS = 16384

# <sys/inotify.h>; the flags of inotify_init1 are the O_ ones of <fcntl.h>.
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000

WATCH_MASK = (
    IN_CREATE
    | IN_DELETE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_DONT_FOLLOW
    | IN_EXCL_UNLINK
)
_ENTRY_CHANGES = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
_SHAPE_CHANGES = IN_ISDIR | IN_DELETE_SELF | IN_MOVE_SELF
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
_GIT = ".git"


class _Inotify:
    """libc's inotify calls, found once; None where there are none."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self.init1 = libc.inotify_init1
        self.init1.argtypes = [ctypes.c_int]
        self.init1.restype = ctypes.c_int
        self.add_watch = libc.inotify_add_watch
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.add_watch.restype = ctypes.c_int


@functools.cache
def _inotify() -> _Inotify | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return _Inotify(libc)
    except (OSError, AttributeError):
        return None


class TreeWatch:
    """inotify watches on the directories a survey's scan walked (and on .git), read to say
    whether a survey of a name could answer anything new since its last scan."""

    def __init__(self, fd: int, calls: _Inotify, root: str) -> None:
        self._fd = fd
        self._calls = calls
        self._root = root
        self._lock = threading.Lock()
        self._dir_of: dict[int, str] = {}  # watch descriptor -> directory ("" the root)
        self._wd_of: dict[str, int] = {}
        self._clean: dict[str, bool] = {}  # by file name: scanned, nothing that matters since
        self._failed = False  # a watch could not be added: every check scans
        # The fd goes with the workspace: an inotify instance is one of the user's few (128).
        self._closer = weakref.finalize(self, os.close, fd)

    @classmethod
    def open(cls, root: str | os.PathLike[str]) -> TreeWatch | None:
        """A watch of the tree at `root`, or None where inotify cannot be had."""
        calls = _inotify()
        if calls is None:
            return None
        fd = calls.init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        return cls(fd, calls, os.fspath(root))

    def close(self) -> None:
        self._closer()

    def unchanged(self, name: str) -> bool:
        """Nothing that matters to a survey of `name` changed since its last scan: that scan's
        generation still holds."""
        with self._lock:
            self._drain()
            return not self._failed and self._clean.get(name, False)

    def before_scan(self, name: str) -> None:
        """A scan of `name` starts: every event queued until now is accounted for by it; any
        later one is read by the next check."""
        with self._lock:
            self._drain()
            self._clean[name] = True

    def after_scan(self, name: str, dirs: Iterable[str]) -> None:
        """Watch every directory the scan walked, and .git for HEAD. A directory watched only
        now may have changed between its listing and its watch: the next check scans again."""
        with self._lock:
            if self._failed:
                return
            wanted = [*dirs, _GIT]
            if len(wanted) > MAX_WATCHED_DIRS + 1:
                self._failed = True
                return
            added = False
            for rel in wanted:
                if rel in self._wd_of:
                    continue
                full = f"{self._root}/{rel}" if rel else self._root
                wd = self._calls.add_watch(self._fd, os.fsencode(full), WATCH_MASK)
                if wd < 0:
                    err = ctypes.get_errno()
                    if err == errno.ENOENT or (err == errno.ENOTDIR and not os.path.isdir(full)):
                        continue  # no .git, or a directory gone since: its parent's event says so
                    # The user's watch limit, most likely (or .git a link to a directory, whose
                    # HEAD no watch here would see): every check scans.
                    self._failed = True
                    return
                old = self._dir_of.get(wd)
                if old is not None:  # the same directory under a new name (it was moved)
                    self._forget(old, wd)
                self._dir_of[wd] = rel
                self._wd_of[rel] = wd
                added = True
            if added:
                self._clean[name] = False

    def _drain(self) -> None:
        """Read every queued event; forget the scans they may have outdated. Lock held."""
        while True:
            try:
                data = os.read(self._fd, 64 << 10)
            except BlockingIOError:
                return  # nothing more queued
            except OSError:
                self._failed = True
                return
            if not data:
                return
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                start = offset + _EVENT.size
                entry = data[start : start + length].split(b"\0", 1)[0]
                offset = start + length
                self._note(wd, mask, os.fsdecode(entry))

    def _note(self, wd: int, mask: int, entry: str) -> None:
        """One event: whatever may change a survey marks the names it concerns unscanned."""
        directory = self._dir_of.get(wd)
        if mask & IN_IGNORED and directory is not None:  # the watch is gone (directory removed)
            self._forget(directory, wd)
            self._dir_of.pop(wd, None)
        elif mask & IN_MOVE_SELF and directory is not None:
            # Whatever is at its old path (or below it) now is another directory, which the
            # next scan must watch anew; the moved ones keep their watches (mapped again where
            # a scan walks them).
            self._forget_below(directory)
        if directory == _GIT and not mask & (IN_Q_OVERFLOW | IN_IGNORED | IN_MOVE_SELF):
            if entry == "HEAD":
                self._dirty(None)
            return  # .git's other files are never read by a survey
        if (
            directory is None
            or mask & (IN_Q_OVERFLOW | IN_IGNORED | _SHAPE_CHANGES)  # lost events, the shape
            or (directory == "" and mask & _ENTRY_CHANGES)  # the root's entries
        ):
            self._dirty(None)
        else:
            self._dirty(entry)

    def _forget(self, directory: str, wd: int) -> None:
        if self._wd_of.get(directory) == wd:
            del self._wd_of[directory]

    def _forget_below(self, directory: str) -> None:
        """No watch is known any more for `directory` and what is under it."""
        under = f"{directory}/"
        for rel in [
            r for r in self._wd_of if not directory or r == directory or r.startswith(under)
        ]:
            del self._wd_of[rel]

    def _dirty(self, entry: str | None) -> None:
        """Mark unscanned the name `entry` (every name when None)."""
        for name in self._clean:
            if entry is None or name == entry:
                self._clean[name] = False
