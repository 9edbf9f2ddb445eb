"""The in-process workspace: the harness itself works on the granted root.

Used when no exec service is configured (`corral run`, the wire tests, a workstation). It keeps
the same rules as the exec service (harness_image/corral_exec), which the conformance suite in
tests/unit/tools_exec checks: same checks, same errors, same bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fnmatch
import functools
import io
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..context.instructions import NamedFileIndex, SurveyGenerations
from ..paths import GrantedRoot, PathVerdict
from ..ports import (
    CommandOutcome,
    DirEntry,
    Fingerprint,
    FoundFile,
    GlobMatches,
    LineWindow,
    PathKind,
    Programs,
    ResolvedPath,
    Survey,
    WorkspaceError,
    workspace_text,
)
from ._result import head_tail_text
from ._treewatch import TreeWatch

HIDDEN_ENV_PREFIX = "CORRAL_"
HIDDEN_ENV = frozenset({"ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"})


def child_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a command the agent runs: nothing naming Corral or the model."""
    source = os.environ if environ is None else environ
    return {
        k: v
        for k, v in source.items()
        if not k.startswith(HIDDEN_ENV_PREFIX) and k not in HIDDEN_ENV
    }


def _os_error(exc: OSError) -> WorkspaceError:
    if exc.errno == errno.ENOENT:
        return WorkspaceError("missing", "no such file or directory")
    reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
    return WorkspaceError("io", reason)


def _kind(path: Path) -> PathKind:
    try:
        mode = path.stat().st_mode
    except OSError:
        return "missing"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


class LocalWorkspace:
    """`Workspace` on this process's own view of the granted root."""

    def __init__(self, root: GrantedRoot | str | os.PathLike[str]) -> None:
        self.granted = root if isinstance(root, GrantedRoot) else GrantedRoot(root)
        self._indexes: dict[str, NamedFileIndex] = {}  # find's, by file name
        self._generations = SurveyGenerations()
        self._after_command: dict[str, int] = {}  # survey generations after the last command
        self._last_generation: dict[str, int] = {}  # by name, of its last scan
        self._scan_lock = threading.Lock()
        self._watch: TreeWatch | None = None
        self._watch_opened = False
        self.scans = 0  # survey scans so far (the tests count them)

    @property
    def root(self) -> Path:
        return self.granted.root

    # ------------------------------------------------------------------------- paths

    async def classify(self, path: str) -> PathVerdict:
        return self.granted.classify(path)

    async def resolve(self, path: str) -> ResolvedPath:
        return self.resolve_now(path)

    def resolve_now(self, path: str) -> ResolvedPath:
        verdict = self.granted.classify(path)
        if verdict is not PathVerdict.INSIDE:
            return ResolvedPath(verdict, "", "missing")
        real = Path(os.path.realpath(self.granted._candidate(path)))
        return ResolvedPath(verdict, self.granted.relative(real), _kind(real))

    def _inside(self, path: str) -> tuple[Path, ResolvedPath]:
        resolved = self.resolve_now(path)
        if resolved.verdict is PathVerdict.OUTSIDE:
            raise WorkspaceError("outside", f"path {path!r} is outside the granted root")
        if resolved.verdict is PathVerdict.UNCERTAIN:
            raise WorkspaceError("uncertain", f"path {path!r} cannot be resolved with certainty")
        real = self.root if resolved.path == "." else self.root / resolved.path
        return real, resolved

    def _file(self, path: str) -> Path:
        real, resolved = self._inside(path)
        if resolved.kind == "missing":
            raise WorkspaceError("missing", "no such file or directory")
        if resolved.kind != "file":
            raise WorkspaceError("not_file", "not a regular file")
        return real

    # ------------------------------------------------------------------------- files

    async def read_lines(self, path: str, offset: int, limit: int, max_bytes: int) -> LineWindow:
        real = self._file(path)
        offset, limit, max_bytes = max(offset, 1), max(limit, 1), max_bytes or 1 << 20
        lines: list[str] = []
        more = clipped = False
        held = 0
        try:
            # Streamed, so a huge file costs only the lines up to the window (and one past it).
            with real.open("rb") as fh:
                number = 0
                while True:
                    number += 1
                    in_window = number >= offset
                    if in_window and (len(lines) == limit or held >= max_bytes):
                        more = bool(fh.peek(1))
                        clipped = more and len(lines) < limit
                        break
                    raw, cut, ended = _read_line(fh, in_window, max_bytes - held)
                    if in_window and raw:
                        held += len(raw)
                        lines.append(workspace_text(raw.removesuffix(b"\n").removesuffix(b"\r")))
                    if cut:
                        more = clipped = True
                        break
                    if ended:
                        break
        except OSError as exc:
            raise _os_error(exc) from exc
        return LineWindow(lines, more, clipped)

    async def read_text(self, path: str, max_bytes: int) -> str:
        return self._read_text_now(path, max_bytes)

    def _read_text_now(self, path: str, max_bytes: int) -> str:
        real = self._file(path)
        try:
            with real.open("rb") as fh:
                data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise _os_error(exc) from exc
        if len(data) > max_bytes:
            raise WorkspaceError("too_large", "the file is larger than maxBytes")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WorkspaceError("not_text", "the file is not valid UTF-8") from exc

    async def write_text(self, path: str, content: str) -> str:
        data = content.encode("utf-8")  # a lone surrogate fails here, before anything is made
        real, resolved = self._inside(path)
        if resolved.kind == "dir":
            raise WorkspaceError("is_dir", "is a directory")
        if resolved.kind == "other":  # a FIFO or a device: writing could block
            raise WorkspaceError("not_file", "not a regular file")
        try:
            try:
                real.parent.mkdir(parents=True, exist_ok=True)
            except FileExistsError as exc:  # a file where a directory must be (as Go says it)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)) from exc
            # The parent may have been created through a path that only now resolves: again.
            real, resolved = self._inside(str(real))
            if resolved.kind not in ("file", "missing"):
                raise WorkspaceError("not_file", "not a regular file")
            real.write_bytes(data)
        except OSError as exc:
            raise _os_error(exc) from exc
        return resolved.path

    async def glob(self, path: str, pattern: str, limit: int) -> GlobMatches:
        base, resolved = self._inside(path or ".")
        return glob_in(self.granted, base, resolved.path, pattern, limit)

    def _index(self, name: str) -> NamedFileIndex:
        if "/" in name or name in ("", ".", "..") or "\x00" in name:
            raise WorkspaceError("bad_request", "name must be a plain file name")
        return self._indexes.setdefault(name, NamedFileIndex(self.root, name))

    async def find(
        self, name: str, known: Mapping[str, Fingerprint], max_bytes: int
    ) -> list[FoundFile]:
        return await asyncio.to_thread(self._index(name).find, known, max_bytes)

    async def list_dir(self, path: str) -> list[DirEntry]:
        return self._list_dir_now(path)

    def _list_dir_now(self, path: str) -> list[DirEntry]:
        real, resolved = self._inside(path or ".")
        if resolved.kind != "dir":
            raise WorkspaceError("not_dir", "not a directory")
        try:
            with os.scandir(real) as entries:
                return [DirEntry(e.name, _entry_kind(e)) for e in entries]
        except OSError as exc:
            raise _os_error(exc) from exc

    def _scan_survey_now(
        self, name: str
    ) -> tuple[list[tuple[str, str, os.stat_result]], list[DirEntry], str | None, int]:
        """What a survey answers, unread, with its generation (`SurveyGenerations`).

        One scan at a time: the watch's "nothing since the last scan" and the generation kept
        for it must belong to the same scan."""
        with self._scan_lock:
            self.scans += 1
            watch = self._tree_watch()
            if watch is not None:
                watch.before_scan(name)
            index = self._index(name)
            matches = index.scan()
            try:
                entries = self._list_dir_now(".")
            except WorkspaceError:
                entries = []
            try:
                head: str | None = self._read_text_now(".git/HEAD", 4096)
            except WorkspaceError:
                head = None
            if watch is not None:
                watch.after_scan(name, index.directories())
            kinds = [(e.name, str(e.kind)) for e in entries]
            generation = self._generations.observe(name, matches, kinds, head)
            self._last_generation[name] = generation
            return matches, entries, head, generation

    async def _scan_survey(
        self, name: str
    ) -> tuple[list[tuple[str, str, os.stat_result]], list[DirEntry], str | None, int]:
        return await asyncio.to_thread(self._scan_survey_now, name)

    def _tree_watch(self) -> TreeWatch | None:
        """The tree's inotify watch, opened at the first scan (None without inotify)."""
        if not self._watch_opened:
            self._watch_opened = True
            self._watch = TreeWatch.open(self.root)
        return self._watch

    def _unchanged_generation(self, name: str) -> int | None:
        """The last scan's generation of `name` when the watch saw nothing since that could
        change it; None when a scan must say (no watch, a change, a scan under way)."""
        watch = self._watch
        if watch is None or not self._scan_lock.acquire(blocking=False):
            return None
        try:
            return self._last_generation.get(name) if watch.unchanged(name) else None
        finally:
            self._scan_lock.release()

    async def survey(
        self, name: str, known: Mapping[str, Fingerprint], max_bytes: int, since: int = 0
    ) -> Survey:
        matches, entries, head, generation = await self._scan_survey(name)
        if since and since == generation:
            return Survey([], [], None, generation, unchanged=True)
        files = await asyncio.to_thread(NamedFileIndex.read, matches, known, max_bytes)
        return Survey(files, entries, head, generation)

    def survey_generation(self, name: str) -> int | None:
        return self._after_command.get(name)

    # ------------------------------------------------------------------------- commands

    async def run(
        self, argv: Sequence[str], *, timeout: float, keep_bytes: int, cwd: str = "."
    ) -> CommandOutcome:
        real, resolved = self._inside(cwd or ".")
        if resolved.kind != "dir":
            raise WorkspaceError("not_dir", "the working directory is not a directory")
        program = argv[0] if "/" in argv[0] else _which(argv[0])
        if program is None:
            raise WorkspaceError("no_program", f"{argv[0]}: program not found")
        # Until this command's scan, nothing is known of what it changed.
        self._after_command.clear()
        try:
            outcome = await run_command(
                [program, *argv[1:]], str(real), timeout, keep_bytes=keep_bytes
            )
        except FileNotFoundError as exc:
            raise WorkspaceError("no_program", f"{argv[0]}: program not found") from exc
        # What the command left of every surveyed name: the change signal the policy reads. The
        # watch answers for a name nothing touched; only a name it cannot vouch for is scanned.
        for name in self._generations.names():
            generation = self._unchanged_generation(name)
            if generation is None:
                generation = (await self._scan_survey(name))[3]
            self._after_command[name] = generation
        return outcome

    async def programs(self) -> Programs:
        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        return Programs(shell, _which("rg"))


def _which(name: str) -> str | None:
    if name == "rg":
        return ripgrep_binary()
    return shutil.which(name)


@functools.cache
def ripgrep_binary() -> str | None:
    """`rg` from PATH (the image's package), else the one the `ripgrep` wheel put beside us."""
    found = shutil.which("rg")
    if found:
        return found
    beside = Path(sys.executable).parent / "rg"
    return str(beside) if beside.exists() else None


def _entry_kind(entry: os.DirEntry[str]) -> PathKind:
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    return "file" if entry.is_file(follow_symlinks=False) else "other"


def _read_line(fh: io.BufferedReader, keep: bool, room: int) -> tuple[bytes, bool, bool]:
    """The next line through "\\n": (kept bytes, cut at `room`, end of file reached)."""
    line = b""
    while True:
        chunk = fh.readline(1 << 16)
        if keep:
            if len(line) + len(chunk) > room:
                return line + chunk[: max(room - len(line), 0)], True, False
            line += chunk
        if not chunk:
            return line, False, True
        if chunk.endswith(b"\n"):
            return line, False, False


# ----------------------------------------------------------------------------- glob


def glob_in(
    granted: GrantedRoot, base: Path, base_rel: str, pattern: str, limit: int
) -> GlobMatches:
    """pathlib's (3.11) glob rules, as the exec service implements them too: fnmatch per
    component (`*` matches a leading dot), `**` alone is this directory and every directory
    below it (symlinked ones not descended), a trailing `/` keeps directories only. Matches
    under .git or whose real path leaves the root are left out."""
    dirs_only = pattern.endswith("/")
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    if not parts:
        raise WorkspaceError("bad_request", "the glob pattern is empty")
    matchers: list[re.Pattern[str] | None] = [
        re.compile(fnmatch.translate(p)) if p != "**" and any(c in p for c in "*?[") else None
        for p in parts
    ]
    seen: dict[tuple[str, ...], None] = {}

    def select(i: int, directory: str, rel: tuple[str, ...]) -> None:
        if i == len(parts):
            if not dirs_only or os.path.isdir(directory):
                seen[rel] = None
            return
        part, dir_only = parts[i], i < len(parts) - 1 or dirs_only
        matcher = matchers[i]
        if part == "**":
            for sub, sub_rel in _directories(directory, rel):
                select(i + 1, sub, sub_rel)
        elif matcher is None:
            child = f"{directory}/{part}"
            if os.path.isdir(child) if dir_only else os.path.exists(child):
                select(i + 1, child, (*rel, part))
        else:
            try:
                with os.scandir(directory) as it:
                    entries = list(it)
            except OSError:
                return
            for entry in entries:
                if dir_only and not _is_dir(entry):
                    continue
                if matcher.match(entry.name):
                    select(i + 1, f"{directory}/{entry.name}", (*rel, entry.name))

    start = tuple(base_rel.split("/")) if base_rel != "." else ()
    select(0, str(base).rstrip("/") or "/", start)
    found = sorted(
        rel
        for rel in seen
        if ".git" not in rel
        and Path(os.path.realpath(granted.root.joinpath(*rel))).is_relative_to(granted.root)
    )
    return GlobMatches(["/".join(rel) or "." for rel in found[:limit]], len(found) > limit)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _directories(directory: str, rel: tuple[str, ...]) -> Iterator[tuple[str, tuple[str, ...]]]:
    yield directory, rel
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except OSError:
        return
    for entry in entries:
        if not entry.is_symlink() and _is_dir(entry):
            yield from _directories(f"{directory}/{entry.name}", (*rel, entry.name))


# ----------------------------------------------------------------------------- commands


async def run_command(
    argv: list[str], cwd: str, timeout: float, *, keep_bytes: int = 1_000_000
) -> CommandOutcome:
    """Run argv in its own process group; kill the whole group on timeout or cancellation.

    Output is read as it comes and at most `keep_bytes` of it is held (its head and its tail),
    so a command that floods its output cannot exhaust the harness's memory.
    """
    if _pidfd_usable():
        return await _run_watching_pidfd(argv, cwd, timeout, keep_bytes)
    proc = await _started(
        asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=child_env(),
            start_new_session=True,
        )
    )
    assert proc.stdout is not None
    kept = HeadTail(keep_bytes)
    stdout = proc.stdout

    async def drain() -> None:
        while chunk := await stdout.read(65536):
            kept.add(chunk)
        await proc.wait()

    try:
        await asyncio.wait_for(drain(), timeout)
    except TimeoutError:
        _kill_group(proc.pid)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 2)
        return CommandOutcome(-9, kept.text(), True)
    except BaseException:
        _kill_group(proc.pid)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 2)
        raise
    return CommandOutcome(proc.returncode or 0, kept.text(), False)


async def _started(
    creating: Coroutine[Any, Any, asyncio.subprocess.Process],
) -> asyncio.subprocess.Process:
    """The process `creating` starts. asyncio's creation awaits after the fork (its pipes and
    its watcher): a cancellation then would leave a running group nobody kills, so the creation
    is finished first and the group killed before the cancellation goes on."""
    task = asyncio.ensure_future(creating)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            proc = await task
            _kill_group(proc.pid)
            await asyncio.wait_for(proc.wait(), 2)
        raise


@functools.cache
def _pidfd_usable() -> bool:
    """Whether a child's exit can be awaited on a pidfd (Linux 5.3 and later)."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


async def _run_watching_pidfd(
    argv: list[str], cwd: str, timeout: float, keep_bytes: int
) -> CommandOutcome:
    """`run_command` with the child's exit read from a pidfd on the event loop.

    asyncio's own subprocess support (3.11) starts a thread per child to wait for its exit:
    about 0.5 ms of the harness's CPU on every `bash` step, which a pidfd spares (the output
    pipe and the pidfd are both watched by the loop, no thread involved)."""
    loop = asyncio.get_running_loop()
    read_end, write_end = os.pipe2(os.O_CLOEXEC)  # the child gets its own copy on 1 and 2
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=write_end,
            env=child_env(),
            start_new_session=True,
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    kept = HeadTail(keep_bytes)
    output_ended: asyncio.Future[None] = loop.create_future()
    exited: asyncio.Future[None] = loop.create_future()
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except OSError:  # no fd left: a thread waits instead
        pidfd = None

    def readable() -> None:
        try:
            chunk = os.read(read_end, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            kept.add(chunk)
        elif not output_ended.done():
            loop.remove_reader(read_end)
            output_ended.set_result(None)

    def reaped(fd: int) -> None:
        if proc.poll() is not None and not exited.done():
            loop.remove_reader(fd)  # a pidfd stays readable: one call is enough
            exited.set_result(None)

    async def until_exit() -> None:
        if pidfd is None:
            await asyncio.to_thread(proc.wait)
        else:
            await exited

    os.set_blocking(read_end, False)
    loop.add_reader(read_end, readable)
    if pidfd is not None:
        loop.add_reader(pidfd, reaped, pidfd)

    async def finished() -> None:
        await output_ended
        await until_exit()

    try:
        try:
            await asyncio.wait_for(finished(), timeout)
        except TimeoutError:
            _kill_group(proc.pid)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(until_exit(), 2)
            return CommandOutcome(-9, kept.text(), True)
        except BaseException:
            _kill_group(proc.pid)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(until_exit(), 2)
            raise
        return CommandOutcome(proc.returncode or 0, kept.text(), False)
    finally:
        loop.remove_reader(read_end)
        os.close(read_end)
        if pidfd is not None:
            loop.remove_reader(pidfd)
            os.close(pidfd)


class HeadTail:
    """The first and the last half of `limit` bytes, and a count of what fell between."""

    def __init__(self, limit: int) -> None:
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > self.half:
            self.dropped += len(self.tail) - self.half
            del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        return head_tail_text(bytes(self.head), self.dropped, bytes(self.tail))


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
