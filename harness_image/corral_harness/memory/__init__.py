"""Long-term memory: a scoped fact store, its recall hook, and turn-record pruning."""

from .embedding import Embedder, HashedLexicalEmbedder, cosine
from .recall import KEEP_TURNS, latest_user_text, prune_turn_records, recall_hook, recall_lines
from .store import DEFAULT_THRESHOLD, Fact, MemoryInputError, MemoryStore, Recalled

__all__ = [
    "DEFAULT_THRESHOLD",
    "KEEP_TURNS",
    "Embedder",
    "Fact",
    "HashedLexicalEmbedder",
    "MemoryInputError",
    "MemoryStore",
    "Recalled",
    "cosine",
    "latest_user_text",
    "prune_turn_records",
    "recall_hook",
    "recall_lines",
]
