"""The granted root: every file path a tool touches is resolved and checked here.

Resolution follows symlinks and `..` before the check, so a link that points out of the root
is outside. A path whose final location cannot be known yet (a missing parent reached through
a symlink, a path with NUL or non-UTF-8 bytes) is *uncertain*: the permission policy asks a
human instead of guessing.
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path


class PathVerdict(StrEnum):
    INSIDE = "inside"
    OUTSIDE = "outside"
    UNCERTAIN = "uncertain"


class PathOutsideRoot(Exception):
    """A tool was asked to touch a path outside its granted root."""

    def __init__(self, path: str, root: Path) -> None:
        super().__init__(f"path {path!r} is outside the granted root {str(root)!r}")
        self.path = path
        self.root = root


class GrantedRoot:
    """A directory tree the agent's tools may use; nothing outside it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.realpath(root))

    def _candidate(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else self.root / p

    def classify(self, path: str) -> PathVerdict:
        if "\x00" in path:
            return PathVerdict.UNCERTAIN
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            return PathVerdict.UNCERTAIN
        candidate = self._candidate(path)
        resolved = Path(os.path.realpath(candidate))
        if not resolved.is_relative_to(self.root):
            return PathVerdict.OUTSIDE
        # realpath resolves what exists; a dangling symlink on the way leaves doubt.
        probe = candidate
        while not probe.exists():
            if probe.is_symlink():
                return PathVerdict.UNCERTAIN
            if probe.parent == probe:
                break
            probe = probe.parent
        return PathVerdict.INSIDE

    def resolve(self, path: str) -> Path:
        """The real path inside the root, or `PathOutsideRoot`."""
        if self.classify(path) is not PathVerdict.INSIDE:
            raise PathOutsideRoot(path, self.root)
        return Path(os.path.realpath(self._candidate(path)))

    def relative(self, path: Path) -> str:
        return str(path.relative_to(self.root)) if path != self.root else "."
