"""Long-term memory: facts with a subject, links between subjects, one embedding per fact.

Everything lives in one sqlite file and every row carries the scope the caller set; the store
never interprets the scope. Recall ranks an exact subject named in the query first, then
subjects linked to it, then facts whose text is similar enough to the query.
"""

from __future__ import annotations

import sqlite3
import time
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .embedding import Embedder, HashedLexicalEmbedder, cosine, words

DEFAULT_THRESHOLD = 0.3
Via = Literal["subject", "link", "text"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS facts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    scope TEXT NOT NULL,
    subject TEXT NOT NULL,
    subject_key TEXT NOT NULL,
    text TEXT NOT NULL,
    embedder TEXT NOT NULL,
    embedding BLOB NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS facts_scope_subject ON facts (scope, subject_key);
CREATE TABLE IF NOT EXISTS links (
    scope TEXT NOT NULL,
    a TEXT NOT NULL,
    b TEXT NOT NULL,
    PRIMARY KEY (scope, a, b)
);
"""


class MemoryInputError(ValueError):
    """Bad input to the memory store."""


def subject_key(subject: str) -> str:
    return " ".join(words(subject))


@dataclass(frozen=True)
class Fact:
    id: int
    subject: str
    text: str


@dataclass(frozen=True)
class Recalled:
    fact: Fact
    via: Via
    score: float

    def line(self) -> str:
        return f"[memory via {self.via}] {self.fact.subject}: {self.fact.text}"


class MemoryStore:
    def __init__(
        self,
        path: str | Path,
        scope: str,
        *,
        embedder: Embedder | None = None,
        threshold: float = DEFAULT_THRESHOLD,
    ) -> None:
        if not scope:
            raise MemoryInputError("a memory scope is required")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.scope = scope
        self.embedder = embedder or HashedLexicalEmbedder()
        self.threshold = threshold
        # The harness may call from a worker thread; sqlite serializes writes itself.
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def _vector(self, text: str) -> bytes:
        return array("f", self.embedder.embed(text)).tobytes()

    # --------------------------------------------------------------------------- writing

    def add(self, subject: str, text: str) -> int:
        now = time.time()
        key = subject_key(subject)
        if not key:
            raise MemoryInputError("a fact needs a subject with at least one word")
        if not text.strip():
            raise MemoryInputError("a fact needs text")
        with self._db:
            cur = self._db.execute(
                "INSERT INTO facts (scope, subject, subject_key, text, embedder, embedding,"
                " updated) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (self.scope, subject, key, text, self.embedder.name, self._vector(text), now),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def rewrite(self, fact_id: int, text: str) -> None:
        if not text.strip():
            raise MemoryInputError("a fact needs text")
        with self._db:
            cur = self._db.execute(
                "UPDATE facts SET text = ?, embedder = ?, embedding = ?, updated = ?"
                " WHERE id = ? AND scope = ?",
                (text, self.embedder.name, self._vector(text), time.time(), fact_id, self.scope),
            )
        if cur.rowcount == 0:
            raise MemoryInputError(f"no fact {fact_id} in scope {self.scope!r}")

    def delete(self, fact_id: int) -> None:
        with self._db:
            cur = self._db.execute(
                "DELETE FROM facts WHERE id = ? AND scope = ?", (fact_id, self.scope)
            )
        if cur.rowcount == 0:
            raise MemoryInputError(f"no fact {fact_id} in scope {self.scope!r}")

    def link(self, a: str, b: str) -> None:
        ka, kb = subject_key(a), subject_key(b)
        if not ka or not kb or ka == kb:
            raise MemoryInputError("a link needs two different subjects")
        with self._db:
            self._db.execute(
                "INSERT OR IGNORE INTO links (scope, a, b) VALUES (?, ?, ?)",
                (self.scope, *sorted((ka, kb))),
            )

    def apply(self, ops: Iterable[Mapping[str, Any]]) -> None:
        """Apply after-turn operations: {op: add|rewrite|delete|link, ...}."""
        needs = {
            "add": ("subject", "text"),
            "rewrite": ("id", "text"),
            "delete": ("id",),
            "link": ("a", "b"),
        }
        for op in ops:
            kind = op.get("op")
            if kind not in needs:
                raise MemoryInputError(f"unknown memory operation {kind!r}")
            missing = [k for k in needs[kind] if k not in op]
            if missing:
                raise MemoryInputError(f"memory operation {kind!r} needs {', '.join(missing)}")
            if kind == "add":
                self.add(str(op["subject"]), str(op["text"]))
            elif kind == "rewrite":
                self.rewrite(int(op["id"]), str(op["text"]))
            elif kind == "delete":
                self.delete(int(op["id"]))
            else:
                self.link(str(op["a"]), str(op["b"]))

    # --------------------------------------------------------------------------- reading

    def facts(self) -> list[Fact]:
        rows = self._db.execute(
            "SELECT id, subject, text FROM facts WHERE scope = ? ORDER BY id", (self.scope,)
        )
        return [Fact(*row) for row in rows]

    def _subjects_in(self, query: str) -> set[str]:
        """Subjects named in the query as whole words (a subject is a run of words)."""
        tokens = words(query)
        keys = {
            row[0]
            for row in self._db.execute(
                "SELECT DISTINCT subject_key FROM facts WHERE scope = ?", (self.scope,)
            )
        }
        keys |= {
            k
            for row in self._db.execute("SELECT a, b FROM links WHERE scope = ?", (self.scope,))
            for k in row
        }
        longest = max((k.count(" ") + 1 for k in keys), default=0)
        phrases = {
            " ".join(tokens[i : i + n])
            for n in range(1, min(longest, len(tokens)) + 1)
            for i in range(len(tokens) - n + 1)
        }
        return keys & phrases

    def _linked(self, keys: set[str]) -> set[str]:
        linked: set[str] = set()
        for a, b in self._db.execute("SELECT a, b FROM links WHERE scope = ?", (self.scope,)):
            if a in keys:
                linked.add(b)
            if b in keys:
                linked.add(a)
        return linked - keys

    def recall(self, query: str, *, limit: int = 5) -> list[Recalled]:
        exact = self._subjects_in(query)
        linked = self._linked(exact)
        query_vec = self.embedder.embed(query)
        # Both sides are unit vectors, so the cosine is a dot product over the query's non-zeros.
        query_nz = [(i, v) for i, v in enumerate(query_vec) if v]
        ranked: list[tuple[int, float, int, Recalled]] = []
        rows = self._db.execute(
            "SELECT id, subject, subject_key, text, embedder, embedding FROM facts WHERE scope = ?",
            (self.scope,),
        )
        for fid, subject, key, text, embedder_name, blob in rows:
            fact = Fact(fid, subject, text)
            if embedder_name == self.embedder.name:
                stored = array("f", blob)
                score = sum(v * stored[i] for i, v in query_nz)
            else:  # stored by another embedder: compare afresh
                score = cosine(query_vec, self.embedder.embed(text))
            if key in exact:
                ranked.append((0, -score, fid, Recalled(fact, "subject", score)))
            elif key in linked:
                ranked.append((1, -score, fid, Recalled(fact, "link", score)))
            elif score >= self.threshold:
                ranked.append((2, -score, fid, Recalled(fact, "text", score)))
        ranked.sort(key=lambda r: r[:3])
        return [r[3] for r in ranked[:limit]]
