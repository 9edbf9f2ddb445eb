"""Long-term memory shared by the custodian (which owns the store) and the harness's local
runs: a scoped fact store over SQLite or PostgreSQL, and its lexical embedder (ADR 0022)."""

from .backends import MemoryBackend, MemoryUnavailable, Origin, PostgresBackend, SqliteBackend
from .embedding import Embedder, HashedLexicalEmbedder, cosine
from .store import DEFAULT_THRESHOLD, Fact, MemoryInputError, MemoryStore, Recalled

__all__ = [
    "DEFAULT_THRESHOLD",
    "Embedder",
    "Fact",
    "HashedLexicalEmbedder",
    "MemoryBackend",
    "MemoryInputError",
    "MemoryStore",
    "MemoryUnavailable",
    "Origin",
    "PostgresBackend",
    "Recalled",
    "SqliteBackend",
    "cosine",
]
