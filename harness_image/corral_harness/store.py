"""The conversation log: one append-only JSON-lines file per conversation in the state dir.

Each line is one record: `sub` (an admitted submission), `ev` (a wire event), `tx` (a
transcript change: `append` a message, or `result` a tool_result block that joins the trailing
user message). Replaying the lines rebuilds the conversation. A torn tail (a crash mid write:
a last line without its newline, or one that does not parse) is cut off the file when it is
read, so the next append starts on a line of its own and nothing after the tear is lost later.
Creating a log fsyncs its directory, so the file itself survives a crash, not only its data.

Durability is a group commit: `append` writes the record at once, and `sync_until(n)` returns
when record n is on disk (fdatasync in a worker thread, one sync covering every record written
before it started). The wire awaits it before an admission is answered and before any event is
shown to a client, so nothing a client has seen can vanish in a crash; the turn itself does not
wait for the disk.

The log can be read back from record N (`read_from`), the durable records only: the operator
archives it as the conversation goes and restores it into another harness when the pod is lost.
The log keeps where each record ends in the file (8 bytes a record) so such a read seeks to its
first record rather than scanning the file.
"""

from __future__ import annotations

import asyncio
import json
import os
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOG_NAME = "log.jsonl"
READ_CHUNK_BYTES = 64 * 1024


class ConversationLog:
    def __init__(self, directory: Path, *, durable: bool) -> None:
        self.directory = directory
        self.path = directory / LOG_NAME
        self.durable = durable
        self._fd: int | None = None
        self.written = 0  # records appended by this process
        self.synced = 0  # records known to be on disk
        self._lock: asyncio.Lock | None = None
        # The byte offset at which each record in the file ends; None until the file is read.
        self._ends: array[int] | None = None

    def exists(self) -> bool:
        return self.path.exists()

    def append(self, record: dict[str, Any]) -> int:
        """Write one record; returns its number for `sync_until`."""
        ends = self._index()
        if self._fd is None:
            created = not self.path.exists()
            if created:
                _make_dirs_durably(self.directory, durable=self.durable)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if created and self.durable:
                _fsync_dir(self.directory)
        line = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        os.write(self._fd, line)
        ends.append((ends[-1] if ends else 0) + len(line))
        self.written += 1
        if not self.durable:
            self.synced = self.written
        return self.written

    async def sync_until(self, record: int) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        while self.synced < record:
            async with self._lock:
                if self.synced >= record or self._fd is None:
                    return
                target = self.written
                await asyncio.to_thread(os.fdatasync, self._fd)
                self.synced = max(self.synced, target)

    def records(self) -> list[dict[str, Any]]:
        """Every whole record, in order; a torn tail is truncated off the file first.

        The records read are synced too (a clean file's sync is cheap): a previous process may
        have died before its last sync, and a read of the log hands out only durable records.
        """
        if not self.path.exists():
            self._ends = array("q")
            return []
        data = self.path.read_bytes()
        records: list[dict[str, Any]] = []
        ends = array("q")
        whole = 0  # bytes up to the end of the last whole record
        while whole < len(data):
            end = data.find(b"\n", whole)
            if end < 0:
                break  # no newline: the write was cut short
            try:
                records.append(json.loads(data[whole:end]))
            except (json.JSONDecodeError, UnicodeDecodeError):
                break  # a line that does not parse ends what can be trusted
            whole = end + 1
            ends.append(whole)
        if whole < len(data) or self.durable:
            with open(self.path, "r+b") as fh:
                if whole < len(data):
                    fh.truncate(whole)
                if self.durable:
                    os.fsync(fh.fileno())
        self._ends = ends
        return records

    def _index(self) -> array[int]:
        """Where each record ends; built by reading the file if no read built it yet."""
        if self._ends is None:
            self.records()
        assert self._ends is not None
        return self._ends

    def durable_count(self) -> int:
        """How many records, from the first, are known to be on disk."""
        return len(self._index()) - (self.written - self.synced)

    def read_from(self, first: int, stop: int) -> Iterator[bytes]:
        """The bytes of records [first, stop), one JSON line each, read from the file lazily.

        The byte range is fixed when this is called; records appended meanwhile are not read.
        A blocking iterator: a server hands it to a thread.
        """
        ends = self._index()
        if not 0 <= first <= stop <= len(ends):
            raise ValueError(f"records {first}..{stop} are not within 0..{len(ends)}")
        begin = ends[first - 1] if first else 0
        end = ends[stop - 1] if stop else 0
        return _read_bytes(self.path, begin, end)

    def close(self) -> None:
        if self._fd is not None:
            if self.durable and self.synced < self.written:
                os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd = None


def _read_bytes(path: Path, begin: int, end: int) -> Iterator[bytes]:
    if end <= begin:
        return
    with open(path, "rb") as fh:
        fh.seek(begin)
        left = end - begin
        while left > 0:
            chunk = fh.read(min(READ_CHUNK_BYTES, left))
            if not chunk:
                raise OSError(f"{path} ended {left} bytes before its records did")
            left -= len(chunk)
            yield chunk


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs_durably(directory: Path, *, durable: bool) -> None:
    """mkdir -p, fsyncing each new directory's parent so the new entries survive a crash."""
    missing: list[Path] = []
    probe = directory
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    directory.mkdir(parents=True, exist_ok=True)
    if durable:
        for created in reversed(missing):
            _fsync_dir(created.parent)


def conversation_dirs(state_dir: Path) -> Iterator[tuple[str, str, Path]]:
    """(agent, conversation, directory) for every stored conversation."""
    base = state_dir / "conversations"
    if not base.is_dir():
        return
    for agent_dir in sorted(base.iterdir()):
        if not agent_dir.is_dir():
            continue
        for conv_dir in sorted(agent_dir.iterdir()):
            if (conv_dir / LOG_NAME).exists():
                yield agent_dir.name, conv_dir.name, conv_dir


def conversation_dir(state_dir: Path, agent: str, conversation: str) -> Path:
    return state_dir / "conversations" / agent / conversation
