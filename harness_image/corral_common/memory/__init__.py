"""Long-term memory shared by the custodian (which owns the store) and the harness's local
runs: a scoped fact store over SQLite or PostgreSQL, and its lexical embedder (ADR 0022)."""

from .backends import MemoryBackend, MemoryUnavailable, Origin, PostgresBackend, SqliteBackend
from .embedding import (
    EMBEDDER_NAMES,
    LEXICAL,
    Embedder,
    EmbedderError,
    HashedLexicalEmbedder,
    MiniLMEmbedder,
    cosine,
    embedder_named,
)
from .store import DEFAULT_THRESHOLD, Fact, MemoryInputError, MemoryStore, Recalled

__all__ = [
    "DEFAULT_THRESHOLD",
    "EMBEDDER_NAMES",
    "LEXICAL",
    "Embedder",
    "EmbedderError",
    "Fact",
    "HashedLexicalEmbedder",
    "MemoryBackend",
    "MemoryInputError",
    "MemoryStore",
    "MemoryUnavailable",
    "MiniLMEmbedder",
    "Origin",
    "PostgresBackend",
    "Recalled",
    "SqliteBackend",
    "cosine",
    "embedder_named",
]
