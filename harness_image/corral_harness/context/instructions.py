"""AGENTS.md discovery with precedence, cached per granted root with explicit invalidation.

Precedence ascends: the root's AGENTS.md < shallower directories < deeper ones < the Agent's own
instructions. Files come back in that order, which is also the order trimming discards them in
(least authoritative first), and "last wins" on conflict for the model.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from .assembly import Unit

INSTRUCTION_FILE_NAME = "AGENTS.md"
AGENT_SOURCE = "agent:instructions"
SKIPPED_DIRS = frozenset({".git"})
# A larger file is read up to this many bytes; trimming decides the rest.
MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class InstructionFile:
    relpath: str  # "AGENTS.md", "pkg/sub/AGENTS.md"
    depth: int  # 0 at the root
    text: str


def _walk(root: str) -> list[tuple[str, int]]:
    """(relative path, depth) of every AGENTS.md, symlinked directories not followed."""
    found: list[tuple[str, int]] = []
    stack: list[tuple[str, str, int]] = [(root, "", 0)]
    while stack:
        path, rel, depth = stack.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in SKIPPED_DIRS:
                        child_rel = f"{rel}/{entry.name}" if rel else entry.name
                        stack.append((entry.path, child_rel, depth + 1))
                elif entry.name == INSTRUCTION_FILE_NAME and entry.is_file(follow_symlinks=False):
                    found.append((f"{rel}/{entry.name}" if rel else entry.name, depth))
            except OSError:
                continue
    return found


def _read(root: str, relpath: str) -> str | None:
    with open(os.path.join(root, relpath), "rb") as fh:
        data = fh.read(MAX_FILE_BYTES)
    return data.decode("utf-8", errors="replace")


def scan_instruction_files(root: str | os.PathLike[str]) -> list[InstructionFile]:
    """Every AGENTS.md under `root` (skipping .git), in ascending precedence."""
    real = os.path.realpath(root)
    if not os.path.isdir(real):
        raise NotADirectoryError(f"granted root {str(root)!r} is not a directory")
    files: list[InstructionFile] = []
    for relpath, depth in _walk(real):
        try:
            text = _read(real, relpath)
        except OSError:
            continue
        if text is not None:
            files.append(InstructionFile(relpath=relpath, depth=depth, text=text))
    # Shallow before deep; a stable name order among equals keeps the output deterministic.
    files.sort(key=lambda f: (f.depth, f.relpath))
    return files


def instruction_units(files: list[InstructionFile], agent_instructions: str) -> list[Unit]:
    """The instruction_files layer's units, least authoritative first."""
    units = [Unit(source=f.relpath, text=f.text) for f in files if f.text.strip()]
    if agent_instructions.strip():
        units.append(Unit(source=AGENT_SOURCE, text=agent_instructions))
    return units


class InstructionFileCache:
    """Scans once per root; `invalidate` drops a root (or all) after files change.

    There is no file watching: the caller knows when a tool may have changed a file and says
    so (the turn policy invalidates after write, edit and bash).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_root: dict[str, list[InstructionFile]] = {}
        self.scans = 0  # how many cold scans ran; lets tests and benches see cache hits

    def load(self, root: str | os.PathLike[str]) -> list[InstructionFile]:
        key = os.path.realpath(root)
        with self._lock:
            cached = self._by_root.get(key)
        if cached is not None:
            return cached
        files = scan_instruction_files(key)
        with self._lock:
            self._by_root[key] = files
            self.scans += 1
        return files

    def invalidate(self, root: str | os.PathLike[str] | None = None) -> None:
        with self._lock:
            if root is None:
                self._by_root.clear()
            else:
                self._by_root.pop(os.path.realpath(root), None)

    def invalidate_path(self, changed: str | os.PathLike[str]) -> bool:
        """Drop every cached root that contains `changed` when it can affect the scan."""
        real = Path(os.path.realpath(changed))
        if real.name != INSTRUCTION_FILE_NAME and not real.is_dir() and real.exists():
            return False
        hit = False
        with self._lock:
            for key in list(self._by_root):
                if real.is_relative_to(key):
                    del self._by_root[key]
                    hit = True
        return hit
