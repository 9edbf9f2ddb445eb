"""Sessions as files, where no API server holds them: the session tree of one `corral run`.

`corral run` stands in for the API server and the operator (docs/children.md, "Under `corral
run`"): every Session of the tree is one JSON document `<name>.json` in one directory, shaped as
the API server would answer it (metadata with name and uid, spec, status). The custodian of a
session in the tree creates its children here (the same manifest it would send to the cluster)
and reads their status; `corral run` runs each new one and writes its status.

Each write replaces the whole file atomically, so a reader never sees half a document. A
document has one writer at a time: the custodian writes it once (create), then `corral run`
alone (status).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import uuid
from pathlib import Path
from typing import Any

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # as the API server's generateName suffixes


class SessionFileError(ValueError):
    pass


def _write_atomically(path: Path, body: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


class SessionFiles:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def path(self, name: str) -> Path:
        if not isinstance(name, str) or len(name) > 253 or not _NAME.match(name):
            raise SessionFileError(f"{name!r} is not a Session name")  # never a path outside
        return self.directory / f"{name}.json"

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            text = self.path(name).read_text()
        except (FileNotFoundError, SessionFileError):
            return None
        try:
            body: dict[str, Any] = json.loads(text)
        except json.JSONDecodeError:
            return None  # claimed by `create` an instant ago, not written yet
        return body

    def every(self) -> list[dict[str, Any]]:
        """Every Session of the tree, by name."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in sorted(self.directory.glob("*.json")):
            body = self.get(path.stem)
            if body is not None:
                found.append(body)
        return found

    def children_of(self, uid: str) -> list[dict[str, Any]]:
        """The Sessions whose parentRef names `uid` (as the label selector
        `corral.dev/parent-uid` and `is_own_child` select them on a cluster)."""
        return [
            s
            for s in self.every()
            if ((s.get("spec") or {}).get("parentRef") or {}).get("uid") == uid
        ]

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Store a new Session, naming it from `metadata.generateName` as the API server does;
        the stored document (with name and uid) is returned. An existing name is refused."""
        body = json.loads(json.dumps(manifest))  # a copy the caller cannot change afterwards
        meta = body.setdefault("metadata", {})
        self.directory.mkdir(parents=True, exist_ok=True)
        for _ in range(16):
            name = meta.get("name") or str(meta.get("generateName", "")) + "".join(
                secrets.choice(_SUFFIX_ALPHABET) for _ in range(5)
            )
            path = self.path(name)
            try:
                # O_EXCL claims the name: two creators never get the same one.
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                if meta.get("name"):
                    raise SessionFileError(f"Session {name!r} already exists") from None
                continue
            os.close(fd)
            meta.pop("generateName", None)
            meta["name"] = name
            meta.setdefault("uid", str(uuid.uuid4()))
            body.setdefault("status", {})
            _write_atomically(path, body)
            return dict(body)
        raise SessionFileError("no free name for the new Session")

    def write_status(self, name: str, status: dict[str, Any]) -> None:
        """Replace the Session's status (the rest of the document stays as it was)."""
        body = self.get(name)
        if body is None:
            raise SessionFileError(f"Session {name!r} is not in {self.directory}")
        body["status"] = status
        _write_atomically(self.path(name), body)
