"""Long-term memory: facts with a subject, links between subjects, one embedding per fact.

A `MemoryStore` is one scope of a backend (SQLite or PostgreSQL: `backends`); the store never
interprets the scope, and every row it reads or writes carries it. Recall ranks an exact subject
named in the query first, then subjects linked to it, then facts whose text is similar enough to
the query. Each fact keeps its origin (the Session and turn that last wrote it), and a recalled
line shows it together with the fact's id, which the memory tools take.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .backends import MemoryBackend, Origin, SqliteBackend
from .embedding import Embedder, HashedLexicalEmbedder, cosine, words

DEFAULT_THRESHOLD = 0.3
MAX_SUBJECT_CHARS = 200
MAX_TEXT_CHARS = 4000
Via = Literal["subject", "link", "text"]
NO_ORIGIN = Origin()


class MemoryInputError(ValueError):
    """Bad input to the memory store."""


def subject_key(subject: str) -> str:
    return " ".join(words(subject))


@dataclass(frozen=True)
class Fact:
    id: int
    subject: str
    text: str
    origin: Origin = NO_ORIGIN


@dataclass(frozen=True)
class Recalled:
    fact: Fact
    via: Via
    score: float

    def line(self) -> str:
        return (
            f"[memory #{self.fact.id} via {self.via}; {self.fact.origin.phrase()}] "
            f"{self.fact.subject}: {self.fact.text}"
        )

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.fact.id,
            "subject": self.fact.subject,
            "text": self.fact.text,
            "via": self.via,
            "score": round(self.score, 4),
            "origin": {"session": self.fact.origin.session, "turn": self.fact.origin.turn},
            "line": self.line(),
        }


def _check_text(text: str) -> None:
    if not text.strip():
        raise MemoryInputError("a fact needs text")
    if len(text) > MAX_TEXT_CHARS:
        raise MemoryInputError(f"a fact's text is at most {MAX_TEXT_CHARS} characters")


class MemoryStore:
    def __init__(
        self,
        backend: MemoryBackend | str | Path,
        scope: str,
        *,
        embedder: Embedder | None = None,
        threshold: float | None = None,
    ) -> None:
        if not scope:
            raise MemoryInputError("a memory scope is required")
        self.backend: MemoryBackend = (
            SqliteBackend(backend) if isinstance(backend, str | Path) else backend
        )
        self.scope = scope
        self.embedder = embedder or HashedLexicalEmbedder()
        # Similarity scales differ between embedders: one may name its own text threshold.
        self.threshold = (
            threshold
            if threshold is not None
            else float(getattr(self.embedder, "recall_threshold", DEFAULT_THRESHOLD))
        )

    def close(self) -> None:
        self.backend.close()

    def _vector(self, text: str) -> bytes:
        return array("f", self.embedder.embed(text)).tobytes()

    # --------------------------------------------------------------------------- writing

    def add(self, subject: str, text: str, origin: Origin = NO_ORIGIN) -> int:
        key = subject_key(subject)
        if not key:
            raise MemoryInputError("a fact needs a subject with at least one word")
        if len(subject) > MAX_SUBJECT_CHARS:
            raise MemoryInputError(f"a subject is at most {MAX_SUBJECT_CHARS} characters")
        _check_text(text)
        return self.backend.insert(
            self.scope,
            subject.strip(),
            key,
            text,
            self.embedder.name,
            self._vector(text),
            origin,
            time.time(),
        )

    def rewrite(self, fact_id: int, text: str, origin: Origin = NO_ORIGIN) -> None:
        _check_text(text)
        done = self.backend.update(
            self.scope, fact_id, text, self.embedder.name, self._vector(text), origin, time.time()
        )
        if not done:
            raise MemoryInputError(f"no fact {fact_id} in scope {self.scope!r}")

    def delete(self, fact_id: int) -> None:
        if not self.backend.delete(self.scope, fact_id):
            raise MemoryInputError(f"no fact {fact_id} in scope {self.scope!r}")

    def link(self, a: str, b: str) -> None:
        ka, kb = subject_key(a), subject_key(b)
        if not ka or not kb or ka == kb:
            raise MemoryInputError("a link needs two different subjects")
        first, second = sorted((ka, kb))
        self.backend.link(self.scope, first, second)

    def apply(self, ops: Iterable[Mapping[str, Any]], origin: Origin = NO_ORIGIN) -> list[int]:
        """Apply memory operations: {op: add|rewrite|delete|link, ...}; the ids added."""
        needs = {
            "add": ("subject", "text"),
            "rewrite": ("id", "text"),
            "delete": ("id",),
            "link": ("a", "b"),
        }
        added: list[int] = []
        for op in ops:
            kind = op.get("op")
            if kind not in needs:
                raise MemoryInputError(f"unknown memory operation {kind!r}")
            missing = [k for k in needs[kind] if k not in op]
            if missing:
                raise MemoryInputError(f"memory operation {kind!r} needs {', '.join(missing)}")
            if kind == "add":
                added.append(self.add(str(op["subject"]), str(op["text"]), origin))
            elif kind == "rewrite":
                self.rewrite(_fact_id(op["id"]), str(op["text"]), origin)
            elif kind == "delete":
                self.delete(_fact_id(op["id"]))
            else:
                self.link(str(op["a"]), str(op["b"]))
        return added

    # --------------------------------------------------------------------------- reading

    def facts(self) -> list[Fact]:
        return [Fact(r.id, r.subject, r.text, r.origin) for r in self.backend.rows(self.scope)]

    def recall(self, query: str, *, limit: int = 5) -> list[Recalled]:
        rows = self.backend.rows(self.scope)
        links = self.backend.links(self.scope)
        keys = {r.subject_key for r in rows} | {k for pair in links for k in pair}
        exact = _subjects_in(words(query), keys)
        linked = {b for a, b in links if a in exact} | {a for a, b in links if b in exact}
        linked -= exact
        query_vec = self.embedder.embed(query)
        # Both sides are unit vectors, so the cosine is a dot product over the query's non-zeros.
        query_nz = [(i, v) for i, v in enumerate(query_vec) if v]
        ranked: list[tuple[int, float, int, Recalled]] = []
        for row in rows:
            fact = Fact(row.id, row.subject, row.text, row.origin)
            if row.embedder == self.embedder.name:
                stored = array("f", row.embedding)
                score = sum(v * stored[i] for i, v in query_nz)
            else:  # stored by another embedder: compare afresh
                score = cosine(query_vec, self.embedder.embed(row.text))
            if row.subject_key in exact:
                ranked.append((0, -score, row.id, Recalled(fact, "subject", score)))
            elif row.subject_key in linked:
                ranked.append((1, -score, row.id, Recalled(fact, "link", score)))
            elif score >= self.threshold:
                ranked.append((2, -score, row.id, Recalled(fact, "text", score)))
        ranked.sort(key=lambda r: r[:3])
        return [r[3] for r in ranked[:limit]]


def _fact_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise MemoryInputError("a fact id is a whole number")
    try:
        return int(value)
    except ValueError as e:
        raise MemoryInputError("a fact id is a whole number") from e


def _subjects_in(tokens: list[str], keys: set[str]) -> set[str]:
    """Subjects named in the query as whole words (a subject is a run of words)."""
    longest = max((k.count(" ") + 1 for k in keys), default=0)
    phrases = {
        " ".join(tokens[i : i + n])
        for n in range(1, min(longest, len(tokens)) + 1)
        for i in range(len(tokens) - n + 1)
    }
    return keys & phrases
