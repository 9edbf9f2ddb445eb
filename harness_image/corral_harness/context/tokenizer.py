"""Token counting behind a protocol, so a real tokenizer can replace the estimate later."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

BYTES_PER_TOKEN = 4


@dataclass(frozen=True)
class TokenCount:
    tokens: int
    estimated: bool


class Tokenizer(Protocol):
    """Counts tokens; `estimated` says whether the counts are exact for the model."""

    @property
    def estimated(self) -> bool: ...

    def count(self, text: str) -> int: ...


class ByteEstimateTokenizer:
    """ceil(UTF-8 bytes / 4): no model vocabulary needed, never under-counts by much."""

    estimated = True

    def count(self, text: str) -> int:
        return -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


DEFAULT_TOKENIZER: Tokenizer = ByteEstimateTokenizer()
