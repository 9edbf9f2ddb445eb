"""Where archived Sessions live. The filesystem backend is the default (a PersistentVolume the
chart mounts into the operator); the layout is one directory per Session uid:

    <root>/<namespace>/<session>/<uid>/events.jsonl   the wire's events, one JSON object a line
    <root>/<namespace>/<session>/<uid>/record.json    format, receipts, the Session as it ended

A name is reused by a later Session, a uid never is, so an audit finds every run of a name.

Reads are capped (the operator's `--max-history-bytes`, the same cap its wire reads have): a
file over it is not read into memory; `ArchiveTooLarge` says which and the cap.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ..driver import byte_size
from ..settings import OperatorSettings
from .record import ArchivedSession

DEFAULT_MAX_OBJECT_BYTES = OperatorSettings().max_history_bytes

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_UID = re.compile(r"^[A-Za-z0-9-]{1,64}$")


class ArchiveStore(Protocol):
    def write(
        self, namespace: str, name: str, uid: str, record: dict[str, Any], events: list[Any]
    ) -> None: ...

    def read(self, namespace: str, name: str, uid: str | None = None) -> ArchivedSession | None: ...

    def write_log(
        self, namespace: str, name: str, uid: str, start: int, end: int, data: bytes
    ) -> None: ...

    def read_log(self, namespace: str, name: str, uid: str) -> tuple[bytes, int]: ...

    def log_end(self, namespace: str, name: str, uid: str) -> int: ...

    def write_wip(
        self, namespace: str, name: str, uid: str, data: bytes, meta: dict[str, Any]
    ) -> None: ...

    def read_wip(
        self, namespace: str, name: str, uid: str
    ) -> tuple[bytes, dict[str, Any]] | None: ...

    def drop_wip(self, namespace: str, name: str, uid: str) -> None: ...


# The work in progress of a turn in flight (docs/turns.md, "A lost pod"): the newest bundle,
# `wip/<session>.bundle`, and what it holds (`wip/<session>.json`: revision, base, savedAt),
# written after the bundle, so a reader that finds the one finds the bundle it names.
def wip_names(name: str) -> tuple[str, str]:
    return f"wip/{name}.bundle", f"wip/{name}.json"


def wip_matches(data: bytes, meta: dict[str, Any]) -> bool:
    """Whether `data` is the bundle `meta` was written for (a crash between the two writes
    leaves a newer bundle beside an older description)."""
    return meta.get("bytes") == len(data)


# The conversation's durable log, archived as it grows (docs/turns.md, "A lost pod"): records
# [start, end) of the harness's log as one object each, named so that they sort in order.
def log_chunk_name(start: int, end: int) -> str:
    return f"{start:012d}-{end:012d}.ndjson"


def log_chain(leaves: Iterable[str]) -> list[tuple[str, int]]:
    """The chunks whose records run on from 0 without a gap (a chunk written twice, by a
    retry, counted once), in order, each with the index after its last record."""
    spans = []
    for leaf in leaves:
        match = _CHUNK.fullmatch(leaf)
        if match is not None:
            spans.append((int(match[1]), int(match[2]), leaf))
    chain, at = [], 0
    for start, end, leaf in sorted(spans, key=lambda span: (span[0], -span[1])):
        if start != at or end <= start:
            continue  # a duplicate or an overlap of what was joined, or after a gap
        chain.append((leaf, end))
        at = end
    return chain


def joined_log(
    chunks: Mapping[str, Callable[[], bytes]], limit: int, what: str
) -> tuple[bytes, int]:
    """The records of the chunks' chain (`log_chain`) and the index after the last; refused
    past `limit`."""
    data, at = bytearray(), 0
    for leaf, end in log_chain(chunks):
        data += chunks[leaf]()
        if len(data) > limit:
            raise ArchiveTooLarge(what, limit)
        at = end
    return bytes(data), at


_CHUNK = re.compile(r"(\d{12})-(\d{12})\.ndjson")


class ArchiveTooLarge(OSError):
    """An archived object is larger than the operator's read cap: it is not read. An OSError,
    as an unreadable volume is: the reader answers that the archive cannot be read."""

    def __init__(self, what: str, limit: int) -> None:
        self.what = what
        self.limit = limit
        super().__init__(
            f"the archive's {what} is larger than {byte_size(limit)} (the operator's "
            "--max-history-bytes, chart value operator.maxHistoryBytes): it is not read"
        )


def read_file_capped(path: Path, limit: int, what: str) -> bytes:
    """The bytes of `path`, refused (unread) past `limit`."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size > limit:
            raise ArchiveTooLarge(what, limit)
        data = file.read(limit + 1)  # the file may have grown since the stat
    if len(data) > limit:
        raise ArchiveTooLarge(what, limit)
    return data


def checked_names(namespace: str, name: str, uid: str | None) -> None:
    # The names come from the API server or a person's URL: never a path of their choosing.
    for label, value in (("namespace", namespace), ("name", name)):
        if not _NAME.match(value):
            raise ValueError(f"{label} {value!r} is not a Kubernetes object name")
    if uid is not None and not _UID.match(uid):
        raise ValueError(f"uid {uid!r} is not a Kubernetes uid")


class FileArchive:
    """The archive on a filesystem: each Session written whole and renamed into place, so a
    reader sees a complete archive or none, never half of one."""

    def __init__(
        self, root: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_OBJECT_BYTES
    ) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    def write(
        self, namespace: str, name: str, uid: str, record: dict[str, Any], events: list[Any]
    ) -> None:
        checked_names(namespace, name, uid)
        parent = self.root / namespace / name
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{uid}.", dir=parent))
        with open(staging / "events.jsonl", "w", encoding="utf-8") as out:
            for event in events:
                out.write(json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n")
            out.flush()
            os.fsync(out.fileno())
        with open(staging / "record.json", "w", encoding="utf-8") as out:
            json.dump(record, out, ensure_ascii=False, indent=1)
            out.flush()
            os.fsync(out.fileno())
        final = parent / uid
        if final.exists():  # archived again (a retry): the newer copy replaces the older
            old = parent / f".{uid}.old"
            os.replace(final, old)
            os.replace(staging, final)
            _remove_tree(old)
        else:
            os.replace(staging, final)

    def read(self, namespace: str, name: str, uid: str | None = None) -> ArchivedSession | None:
        """The archive of that uid, or (no uid) of the run of this name archived last."""
        checked_names(namespace, name, uid)
        parent = self.root / namespace / name
        if uid is None:
            runs = [d for d in parent.glob("*") if d.is_dir() and not d.name.startswith(".")]
            found = [self._load(d) for d in runs]
            loaded = [a for a in found if a is not None]
            if not loaded:
                return None
            return max(loaded, key=lambda a: str(a.record.get("archivedAt", "")))
        return self._load(parent / uid)

    def _log_dir(self, namespace: str, name: str, uid: str) -> Path:
        # Beside the run's directory, which the final archive replaces whole.
        return self.root / namespace / name / f".conversation-{uid}"

    def write_log(
        self, namespace: str, name: str, uid: str, start: int, end: int, data: bytes
    ) -> None:
        checked_names(namespace, name, uid)
        where = self._log_dir(namespace, name, uid)
        where.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(prefix=".chunk.", dir=where)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(staging, where / log_chunk_name(start, end))

    def read_log(self, namespace: str, name: str, uid: str) -> tuple[bytes, int]:
        checked_names(namespace, name, uid)
        where = self._log_dir(namespace, name, uid)
        run = f"{namespace}/{name}/{uid}"
        if not where.is_dir():
            return b"", 0

        def reader(path: Path) -> Callable[[], bytes]:
            return lambda: read_file_capped(path, self.max_bytes, f"log of {run}")

        chunks = {path.name: reader(path) for path in where.iterdir()}
        return joined_log(chunks, self.max_bytes, f"conversation log of {run}")

    def log_end(self, namespace: str, name: str, uid: str) -> int:
        """The index after the archived log's last record, from the chunks' names alone."""
        checked_names(namespace, name, uid)
        where = self._log_dir(namespace, name, uid)
        chain = log_chain(p.name for p in where.iterdir()) if where.is_dir() else []
        return chain[-1][1] if chain else 0

    def _wip_dir(self, namespace: str, name: str, uid: str) -> Path:
        return self.root / namespace / name / f".wip-{uid}"

    def write_wip(
        self, namespace: str, name: str, uid: str, data: bytes, meta: dict[str, Any]
    ) -> None:
        checked_names(namespace, name, uid)
        where = self._wip_dir(namespace, name, uid)
        bundle, described = wip_names(name)
        for leaf, body in ((bundle, data), (described, json.dumps(meta).encode())):
            target = where / leaf
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, staging = tempfile.mkstemp(prefix=".wip.", dir=target.parent)
            with os.fdopen(fd, "wb") as out:
                out.write(body)
                out.flush()
                os.fsync(out.fileno())
            os.replace(staging, target)

    def read_wip(self, namespace: str, name: str, uid: str) -> tuple[bytes, dict[str, Any]] | None:
        checked_names(namespace, name, uid)
        where = self._wip_dir(namespace, name, uid)
        bundle, described = wip_names(name)
        run = f"{namespace}/{name}/{uid}"
        try:
            meta = json.loads(read_file_capped(where / described, self.max_bytes, f"wip of {run}"))
            data = read_file_capped(where / bundle, self.max_bytes, f"wip of {run}")
        except FileNotFoundError:
            return None
        return (data, meta) if wip_matches(data, meta) else None

    def drop_wip(self, namespace: str, name: str, uid: str) -> None:
        checked_names(namespace, name, uid)
        where = self._wip_dir(namespace, name, uid)
        if where.is_dir():
            _remove_tree(where)

    def _load(self, where: Path) -> ArchivedSession | None:
        run = "/".join(where.parts[-3:])
        try:
            record = json.loads(
                read_file_capped(where / "record.json", self.max_bytes, f"record of {run}")
            )
            text = read_file_capped(where / "events.jsonl", self.max_bytes, f"transcript of {run}")
        except FileNotFoundError:
            return None
        events = [json.loads(line) for line in text.splitlines() if line.strip()]
        return ArchivedSession(record, events)


def _remove_tree(path: Path) -> None:
    for child in sorted(path.rglob("*"), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    path.rmdir()
