"""AGENTS.md discovery with precedence, cached per granted root with explicit invalidation.

Precedence ascends: the root's AGENTS.md < shallower directories < deeper ones < the Agent's own
instructions. Files come back in that order, which is also the order trimming discards them in
(least authoritative first), and "last wins" on conflict for the model.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..ports import Fingerprint, FoundFile, workspace_text
from .assembly import Unit

INSTRUCTION_FILE_NAME = "AGENTS.md"
AGENT_SOURCE = "agent:instructions"
SKIPPED_DIRS = frozenset({".git"})
# A larger file is read up to this many bytes; trimming decides the rest.
MAX_FILE_BYTES = 1 << 20
# A file or directory changed this recently is read again even when its size and mtime look
# unchanged: the filesystem's clock is coarse, so a change in the same tick keeps its mtime.
RACY_WINDOW_NS = 2_000_000_000


@dataclass(frozen=True)
class InstructionFile:
    relpath: str  # "AGENTS.md", "pkg/sub/AGENTS.md"
    depth: int  # 0 at the root
    text: str
    size: int = -1  # with mtime_ns, the fingerprint a rescan compares against
    mtime_ns: int = -1


class InstructionSource(Protocol):
    """Where the files are found: the workspace (in-process, or the exec service)."""

    @property
    def root(self) -> Path: ...

    async def find(
        self, name: str, known: Mapping[str, Fingerprint], max_bytes: int
    ) -> list[FoundFile]: ...


@dataclass(frozen=True)
class _Listing:
    mtime_ns: int
    trusted: bool  # listed at least RACY_WINDOW_NS after its last change
    subdirs: tuple[str, ...]
    has: bool  # holds a regular file of the index's name


class NamedFileIndex:
    """Every regular file of one name under a local root, found again cheaply: the in-process
    `Workspace.find` (the exec service's tree index keeps the same rules, in Go).

    .git and symlinked directories are skipped. A directory whose mtime has not changed since
    it was listed is not listed again (creating, removing or renaming an entry changes its
    directory's mtime), unless it was listed within RACY_WINDOW_NS of its last change.
    """

    def __init__(self, root: str | os.PathLike[str], name: str) -> None:
        self.root = os.fspath(root)
        self.name = name
        self._dirs: dict[str, _Listing] = {}
        self._lock = threading.Lock()

    def _list(self, path: str, mtime: int, now: int) -> _Listing:
        subdirs: list[str] = []
        has = False
        with os.scandir(path) as it:
            for entry in it:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in SKIPPED_DIRS:
                            subdirs.append(entry.name)
                    elif entry.name == self.name and entry.is_file(follow_symlinks=False):
                        has = True
                except OSError:
                    continue
        return _Listing(mtime, mtime < now - RACY_WINDOW_NS, tuple(subdirs), has)

    def scan(self) -> list[tuple[str, str, os.stat_result]]:
        """(relative path, path, lstat) of every match."""
        with self._lock:
            now = time.time_ns()
            dirs: dict[str, _Listing] = {}
            found: list[tuple[str, str, os.stat_result]] = []
            stack = [""]
            while stack:
                rel = stack.pop()
                full = f"{self.root}/{rel}" if rel else self.root
                try:
                    info = os.lstat(full)
                    if not stat.S_ISDIR(info.st_mode):
                        continue
                    listing = self._dirs.get(rel)
                    if (
                        listing is None
                        or not listing.trusted
                        or listing.mtime_ns != info.st_mtime_ns
                    ):
                        listing = self._list(full, info.st_mtime_ns, now)
                except OSError:
                    continue
                dirs[rel] = listing
                stack.extend(f"{rel}/{sub}" if rel else sub for sub in listing.subdirs)
                if listing.has:
                    child = f"{full}/{self.name}"
                    try:
                        file_info = os.lstat(child)
                    except OSError:
                        continue
                    if stat.S_ISREG(file_info.st_mode):
                        found.append((f"{rel}/{self.name}" if rel else self.name, child, file_info))
            self._dirs = dirs
            return found

    def directories(self) -> list[str]:
        """The directories the last scan walked, relative to the root ("" the root)."""
        with self._lock:
            return list(self._dirs)

    def find(self, known: Mapping[str, Fingerprint], max_bytes: int) -> list[FoundFile]:
        """Every match; one whose fingerprint is in `known` comes back without its content."""
        return self.read(self.scan(), known, max_bytes)

    @staticmethod
    def read(
        matches: list[tuple[str, str, os.stat_result]],
        known: Mapping[str, Fingerprint],
        max_bytes: int,
    ) -> list[FoundFile]:
        """`scan`'s matches as `find` answers them."""
        found: list[FoundFile] = []
        for rel, full, info in matches:
            size, mtime = info.st_size, info.st_mtime_ns
            if known.get(rel) == (size, mtime):
                found.append(FoundFile(rel, size, mtime, None))
                continue
            try:
                with open(full, "rb", opener=_no_follow) as fh:
                    data = fh.read(max_bytes)
            except OSError:
                continue
            found.append(FoundFile(rel, size, mtime, workspace_text(data)))
        return found


class SurveyGenerations:
    """The survey's change signal, kept by the in-process workspace as the exec service keeps
    it (corral_exec/generation.go): per file name a counter that moves whenever a scan differs
    from the previous one (the matches' paths, sizes and mtimes, the root's entries, .git/HEAD)
    or holds a match changed within RACY_WINDOW_NS, whose fingerprint cannot be trusted yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, tuple[int, object]] = {}

    def names(self) -> list[str]:
        with self._lock:
            return list(self._by_name)

    def observe(
        self,
        name: str,
        matches: list[tuple[str, str, os.stat_result]],
        entries: list[tuple[str, str]],
        git_head: str | None,
    ) -> int:
        racy_after = time.time_ns() - RACY_WINDOW_NS
        racy = any(info.st_mtime_ns >= racy_after for _, _, info in matches)
        signature = (
            tuple(sorted((rel, info.st_size, info.st_mtime_ns) for rel, _, info in matches)),
            tuple(sorted(entries)),
            git_head,
        )
        with self._lock:
            number, previous = self._by_name.get(name, (0, None))
            if racy or number == 0 or previous != signature:
                number += 1
            self._by_name[name] = (number, signature)
            return number


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


def _files_from(
    found: list[FoundFile], previous: list[InstructionFile], read_at_ns: int = 0
) -> list[InstructionFile]:
    """Instruction files in ascending precedence; unchanged ones keep their previous text.

    A file read within RACY_WINDOW_NS of its last change gets no fingerprint (size -1): the
    clock is coarse, so a rewrite in the same tick could keep size and mtime, and the next scan
    must read it again."""
    texts = {f.relpath: (f.text, f.size) for f in previous}
    files: list[InstructionFile] = []
    for item in found:
        if item.content is not None:
            text, trusted = item.content, item.mtime_ns < read_at_ns - RACY_WINDOW_NS
        elif item.path in texts:
            text, trusted = texts[item.path][0], True
        else:
            continue
        size, mtime = (item.size, item.mtime_ns) if trusted else (-1, -1)
        files.append(InstructionFile(item.path, item.path.count("/"), text, size, mtime))
    # Shallow before deep; a stable name order among equals keeps the output deterministic.
    files.sort(key=lambda f: (f.depth, f.relpath))
    return files


def scan_instruction_files(root: str | os.PathLike[str]) -> list[InstructionFile]:
    """Every AGENTS.md under a local `root` (skipping .git), in ascending precedence."""
    real = os.path.realpath(root)
    if not os.path.isdir(real):
        raise NotADirectoryError(f"granted root {str(root)!r} is not a directory")
    found = NamedFileIndex(real, INSTRUCTION_FILE_NAME).find({}, MAX_FILE_BYTES)
    return _files_from(found, [])


def instruction_units(files: list[InstructionFile], agent_instructions: str) -> list[Unit]:
    """The instruction_files layer's units, least authoritative first."""
    # isspace, not strip: no copy of every file's text at every step.
    units = [Unit(source=f.relpath, text=f.text) for f in files if f.text and not f.text.isspace()]
    if agent_instructions.strip():
        units.append(Unit(source=AGENT_SOURCE, text=agent_instructions))
    return units


class InstructionFileCache:
    """Scans once per root; `invalidate` marks a root (or all) stale after files may have
    changed, and the next load rescans it.

    There is no file watching: the caller knows when a tool may have changed a file and says
    so (the turn policy invalidates after write and edit, and asks `command_ran` after bash).
    A rescan through a workspace (`refresh`) sends the fingerprints it holds, so unchanged files
    are not read again, and the survey generation its files were read at, so an unchanged tree
    is confirmed (`confirm`) without any file travelling.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_root: dict[str, list[InstructionFile]] = {}
        self._generation: dict[str, int] = {}  # the workspace's survey generation, by root
        self._stale: set[str] = set()
        self.scans = 0  # how many scans ran; lets tests and benches see cache hits
        self.confirmations = 0  # how many rescans found the tree unchanged

    def _fresh(self, key: str) -> list[InstructionFile] | None:
        with self._lock:
            return None if key in self._stale else self._by_root.get(key)

    def _store(self, key: str, files: list[InstructionFile], generation: int = 0) -> None:
        with self._lock:
            self._by_root[key] = files
            self._generation[key] = generation  # with the files, under one lock: never apart
            self._stale.discard(key)
            self.scans += 1

    def load(self, root: str | os.PathLike[str]) -> list[InstructionFile]:
        """The files of a local root, scanned here when not cached (`corral context`)."""
        key = os.path.realpath(root)
        cached = self._fresh(key)
        if cached is not None:
            return cached
        files = scan_instruction_files(key)
        self._store(key, files)
        return files

    def fresh(self, root: str | os.PathLike[str]) -> list[InstructionFile] | None:
        """The cached files of a workspace root, unless stale or never scanned."""
        return self._fresh(str(root))

    def last(self, root: str | os.PathLike[str]) -> list[InstructionFile]:
        """The files last seen for a root, stale or not (nothing when never scanned)."""
        with self._lock:
            return list(self._by_root.get(str(root), []))

    def fingerprints(self, root: str | os.PathLike[str]) -> dict[str, Fingerprint]:
        """What a rescan may skip reading: the trusted fingerprints held for a root."""
        with self._lock:
            previous = self._by_root.get(str(root), [])
        return {f.relpath: (f.size, f.mtime_ns) for f in previous if f.size >= 0}

    def update(
        self,
        root: str | os.PathLike[str],
        found: list[FoundFile],
        asked_at_ns: int,
        generation: int = 0,
    ) -> list[InstructionFile]:
        """Take a rescan's answer (asked for at `asked_at_ns`, with `fingerprints(root)`), read
        at the workspace's survey `generation` (0: the workspace gave none)."""
        key = str(root)
        with self._lock:
            previous = list(self._by_root.get(key, []))
        files = _files_from(found, previous, asked_at_ns)
        self._store(key, files, generation)
        return files

    def generation(self, root: str | os.PathLike[str]) -> int:
        """The survey generation the cached files were read at (0: none, or not cached)."""
        with self._lock:
            return self._generation.get(str(root), 0) if str(root) in self._by_root else 0

    def confirm(self, root: str | os.PathLike[str], generation: int) -> list[InstructionFile]:
        """The workspace answered that its tree is still at `generation`: the cached files are
        fresh again, untouched. (Files a concurrent rescan stored at another generation in the
        meantime stand as they are: they were read later.)"""
        key = str(root)
        with self._lock:
            if self._generation.get(key) == generation:
                self._stale.discard(key)
                self.confirmations += 1
            return self._by_root.get(key, [])

    def command_ran(self, root: str | os.PathLike[str], generation: int | None) -> None:
        """A command ran in the root and may have changed anything; `generation` is the
        workspace's survey generation after it (None when the workspace cannot say). Unless it
        is the one the cached files were read at, the root is stale."""
        key = str(root)
        with self._lock:
            if key not in self._by_root:
                return
            if not generation or self._generation.get(key) != generation:
                self._stale.add(key)

    async def refresh(self, source: InstructionSource) -> list[InstructionFile]:
        """The files of a workspace, rescanned through it when stale or not cached."""
        cached = self.fresh(source.root)
        if cached is not None:
            return cached
        known = self.fingerprints(source.root)
        # The same clock as the files' mtimes: this process's, or the node's for a pod.
        asked_at = time.time_ns()
        found = await source.find(INSTRUCTION_FILE_NAME, known, MAX_FILE_BYTES)
        return self.update(source.root, found, asked_at)

    def invalidate(self, root: str | os.PathLike[str] | None = None) -> None:
        with self._lock:
            if root is None:
                self._stale.update(self._by_root)
                return
            key = str(root)
            if key not in self._by_root and self._by_root:
                key = os.path.realpath(key)  # a local root named another way
            if key in self._by_root:
                self._stale.add(key)

    def invalidate_path(self, changed: str | os.PathLike[str]) -> bool:
        """Mark stale every cached local root that contains `changed` when it can affect the
        scan (`corral context` and tests; the turn policy asks its workspace instead)."""
        real = Path(os.path.realpath(changed))
        if real.name != INSTRUCTION_FILE_NAME and not real.is_dir() and real.exists():
            return False
        hit = False
        with self._lock:
            for key in self._by_root:
                if real.is_relative_to(key):
                    self._stale.add(key)
                    hit = True
        return hit
