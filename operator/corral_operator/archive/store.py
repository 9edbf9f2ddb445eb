"""Where archived Sessions live. The filesystem backend is the default (a PersistentVolume the
chart mounts into the operator); the layout is one directory per Session uid:

    <root>/<namespace>/<session>/<uid>/events.jsonl   the wire's events, one JSON object a line
    <root>/<namespace>/<session>/<uid>/record.json    format, receipts, the Session as it ended

A name is reused by a later Session, a uid never is, so an audit finds every run of a name.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Protocol

from .record import ArchivedSession

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_UID = re.compile(r"^[A-Za-z0-9-]{1,64}$")


class ArchiveStore(Protocol):
    def write(
        self, namespace: str, name: str, uid: str, record: dict[str, Any], events: list[Any]
    ) -> None: ...

    def read(self, namespace: str, name: str, uid: str | None = None) -> ArchivedSession | None: ...


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

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

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

    @staticmethod
    def _load(where: Path) -> ArchivedSession | None:
        try:
            record = json.loads((where / "record.json").read_text(encoding="utf-8"))
            lines = (where / "events.jsonl").read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return None
        return ArchivedSession(record, [json.loads(line) for line in lines if line.strip()])


def _remove_tree(path: Path) -> None:
    for child in sorted(path.rglob("*"), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    path.rmdir()
