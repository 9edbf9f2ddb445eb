"""Long-term memory in the harness: the recall and after-turn hooks, and turn-record pruning.

The store itself is `corral_common.memory`; in a pod (and in `corral run`) the custodian owns
it and the harness reaches it only through `custodian_client.memory` (docs/memory.md).
"""

from corral_common.memory import (
    DEFAULT_THRESHOLD,
    Embedder,
    Fact,
    HashedLexicalEmbedder,
    MemoryInputError,
    MemoryStore,
    Origin,
    Recalled,
    cosine,
)

from .recall import (
    KEEP_TURNS,
    MemorySource,
    extract_after_turn,
    latest_user_text,
    prune_turn_records,
    recall_hook,
    recall_lines,
)

__all__ = [
    "DEFAULT_THRESHOLD",
    "KEEP_TURNS",
    "Embedder",
    "Fact",
    "HashedLexicalEmbedder",
    "MemoryInputError",
    "MemorySource",
    "MemoryStore",
    "Origin",
    "Recalled",
    "cosine",
    "extract_after_turn",
    "latest_user_text",
    "prune_turn_records",
    "recall_hook",
    "recall_lines",
]
